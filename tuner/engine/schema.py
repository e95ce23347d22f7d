"""The engine API's request schema: every field a client sends is checked here, at the edge, so that no
request can reach the engine thread with a value that would fail inside it (a seed torch cannot take,
a temperature whose reciprocal overflows, a body nested deeper than the parser's stack).

Every refusal is an ApiError, which the server turns into a JSON error body with a 4xx status. The same
sampling checks serve /v1/completions and any other generation endpoint (`parse_sampling`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

MAX_BODY_BYTES = 8 * 2**20
MAX_JSON_DEPTH = 32
MAX_PROMPTS = 256
SEED_MIN = -(2**63)  # torch.Generator.manual_seed's range, as vLLM's API declares it
SEED_MAX = 2**63 - 1
PRIORITY_ABS_MAX = 2**31
SAMPLING_EPS = 1e-5  # below this a temperature means greedy decoding (as in vLLM)


class ApiError(Exception):
    """A refused request: the status and the OpenAI-style error body."""

    def __init__(self, status: int, message: str, *, type: str = "BadRequestError",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.status}}


ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 405: "MethodNotAllowedError",
               413: "RequestEntityTooLargeError", 415: "UnsupportedMediaTypeError",
               500: "InternalServerError", 503: "ServiceUnavailableError"}


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "BadRequestError" if 400 <= status < 500 else "InternalServerError")


# ---------------------------------------------------------------------------- the body
def json_depth(raw: str) -> int:
    """The deepest nesting of arrays and objects in a JSON text (brackets inside strings do not count)."""
    depth = deepest = 0
    in_str = escaped = False
    for ch in raw:
        if in_str:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _no_constant(name: str) -> Any:
    raise ApiError(400, f"{name} is not a JSON number (the body must be strict JSON)")


def parse_body(raw: bytes) -> Any:
    """Decode a request body: size, UTF-8, nesting depth, strict JSON (no NaN or Infinity)."""
    if len(raw) > MAX_BODY_BYTES:
        raise ApiError(413, f"the request body is {len(raw)} bytes, over the limit of {MAX_BODY_BYTES}",
                       type=error_type(413))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "the request body is not valid UTF-8") from None
    if json_depth(text) > MAX_JSON_DEPTH:
        raise ApiError(400, f"the request body is nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        body = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc.msg} at character {exc.pos}") from None
    except RecursionError:  # pragma: no cover - the depth check comes first
        raise ApiError(400, "the request body is nested too deeply") from None
    check_unicode(body)
    return body


def check_unicode(body: Any) -> None:
    """Refuse a body with a string (a value or a key, anywhere) that is not valid Unicode: JSON's `\\ud800`
    escapes decode to lone surrogates, which no tokenizer, encoder or log line can take."""
    stack: list[tuple[str, Any]] = [("", body)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, dict):
            for k, item in v.items():
                where = f"{path}.{k}" if path else str(k)
                _valid_text(k, f"a key in {path or 'the body'}", path.split(".")[0].split("[")[0] or None)
                stack.append((where, item))
        elif isinstance(v, list):
            stack.extend((f"{path}[{i}]", item) for i, item in enumerate(v))
        elif isinstance(v, str):
            _valid_text(v, path or "the body", path.split(".")[0].split("[")[0] or None)


def _valid_text(text: str, where: str, param: str | None) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        raise ApiError(400, f"{_short(where)} is not valid Unicode: a lone surrogate U+{code:04X} at character "
                            f"{exc.start} (a \\u escape of half a surrogate pair)", param=param) from None


# ---------------------------------------------------------------------------- fields
def _number(body: dict[str, Any], name: str, default: Any, kind: type, *, low: float | None = None,
            high: float | None = None) -> Any:
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ApiError(400, f"{name} must be a{'n integer' if kind is int else ' number'} (got {_short(v)})",
                       param=name)
    if isinstance(v, float) and not math.isfinite(v):
        raise ApiError(400, f"{name} must be finite (got {v!r})", param=name)
    if kind is int and isinstance(v, float):
        if not v.is_integer():
            raise ApiError(400, f"{name} must be an integer (got {v!r})", param=name)
        v = int(v)
    if low is not None and v < low:
        raise ApiError(400, f"{name} must be at least {low} (got {_short(v)})", param=name)
    if high is not None and v > high:
        raise ApiError(400, f"{name} must be at most {high} (got {_short(v)})", param=name)
    return kind(v)


def _flag(body: dict[str, Any], name: str) -> bool:
    v = body.get(name, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise ApiError(400, f"{name} must be true or false (got {_short(v)})", param=name)
    return v


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class Sampling:
    """Validated sampling parameters. `temperature` 0 means greedy."""

    max_tokens: int
    temperature: float
    seed: int | None
    ignore_eos: bool
    priority: int


def parse_sampling(body: dict[str, Any], *, max_tokens_default: int = 16) -> Sampling:
    """The sampling fields every generation endpoint shares; unsupported ones are refused by name."""
    max_tokens = _number(body, "max_tokens", max_tokens_default, int, low=1, high=2**31)
    temperature = _number(body, "temperature", 1.0, float, low=0.0)
    if temperature < SAMPLING_EPS:
        temperature = 0.0
    seed = body.get("seed")
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ApiError(400, f"seed must be an integer (got {_short(seed)})", param="seed")
        if not SEED_MIN <= seed <= SEED_MAX:
            raise ApiError(400, f"seed must be between {SEED_MIN} and {SEED_MAX} (got {_short(seed)})",
                           param="seed")
    n = _number(body, "n", 1, int, low=1, high=2**31)
    if n != 1:
        raise ApiError(400, "only n=1 is supported", param="n")
    top_p = _number(body, "top_p", 1.0, float, low=0.0, high=1.0)
    if top_p != 1.0:
        raise ApiError(400, "only top_p=1 is supported", param="top_p")
    stop = body.get("stop")
    if stop not in (None, "", []):
        if not isinstance(stop, str | list):
            raise ApiError(400, "stop must be a string or a list of strings", param="stop")
        raise ApiError(400, "stop sequences are not supported", param="stop")
    for name in ("logprobs", "top_logprobs"):
        if body.get(name) not in (None, False):
            raise ApiError(400, f"{name} is not supported", param=name)
    return Sampling(max_tokens=max_tokens, temperature=temperature, seed=seed,
                    ignore_eos=_flag(body, "ignore_eos"),
                    priority=_number(body, "priority", 0, int, low=-PRIORITY_ABS_MAX, high=PRIORITY_ABS_MAX))


@dataclass(frozen=True)
class CompletionRequest:
    prompts: list[list[int]]
    sampling: Sampling
    stream: bool
    include_usage: bool
    return_token_ids: bool
    chat: bool = False  # a /v1/chat/completions request (its answer's shape)


def parse_completion(body: Any, *, model_name: str, vocab_size: int, max_model_len: int,
                     encode: Any) -> CompletionRequest:
    """A /v1/completions body, checked whole. `encode` turns a string prompt into token ids."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != model_name:
        raise ApiError(404, f"The model `{_short(model)}` does not exist.", type="NotFoundError", param="model")
    prompts = parse_prompts(body.get("prompt"), vocab_size=vocab_size, encode=encode)
    sampling = parse_sampling(body)
    if body.get("echo") not in (None, False):
        raise ApiError(400, "echo is not supported", param="echo")
    for p in prompts:
        if len(p) + sampling.max_tokens > max_model_len:
            raise ApiError(400, f"This model's maximum context length is {max_model_len} tokens. "
                                f"However, you requested {len(p) + sampling.max_tokens} tokens ({len(p)} in the "
                                f"prompt, {sampling.max_tokens} in the completion).", param="prompt")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise ApiError(400, "stream_options must be an object", param="stream_options")
    return CompletionRequest(prompts=prompts, sampling=sampling, stream=_flag(body, "stream"),
                             include_usage=_flag(stream_options, "include_usage"),
                             return_token_ids=_flag(body, "return_token_ids"))


def parse_prompts(prompt: Any, *, vocab_size: int, encode: Any) -> list[list[int]]:
    """A prompt: a string, a list of token ids, or a list of either (at most MAX_PROMPTS)."""
    def one(p: Any) -> list[int] | None:
        if isinstance(p, str):
            return list(encode(p))
        if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            return list(p)
        return None

    single = one(prompt)
    if single is not None:
        out = [single]
    elif isinstance(prompt, list) and prompt:
        if len(prompt) > MAX_PROMPTS:
            raise ApiError(400, f"at most {MAX_PROMPTS} prompts per request (got {len(prompt)})", param="prompt")
        parts = [one(p) for p in prompt]
        if any(p is None for p in parts):
            raise ApiError(400, "prompt must be a string, a list of token ids, or a list of either",
                           param="prompt")
        out = [p for p in parts if p is not None]
    else:
        raise ApiError(400, "prompt must be a string, a list of token ids, or a list of either", param="prompt")
    for p in out:
        if not p:
            raise ApiError(400, "the prompt is empty", param="prompt")
        bad = [t for t in p if not 0 <= t < vocab_size]
        if bad:
            raise ApiError(400, f"token id {_short(bad[0])} is out of vocabulary (0..{vocab_size - 1})",
                           param="prompt")
    return out
