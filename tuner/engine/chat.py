"""/v1/chat/completions for the reference engine: messages rendered with a chat template into one prompt,
then generated as a completion; answers in the chat format (`message` / `delta` chunks, usage).

The template is the checkpoint's own (`chat_template` in tokenizer_config.json, or chat_template.jinja)
when the engine serves one, else the preset's plain template (the one `tuner make-model` writes). Templates
are rendered in Jinja's sandbox.
"""

from __future__ import annotations

import json
import time
from functools import cached_property
from pathlib import Path
from typing import Any

from tuner.engine.checkpoint import CHAT_TEMPLATE

# chat-only fields a completion does not take (the rest of the body passes through and is checked there)
_CHAT_ONLY = ("messages", "max_completion_tokens", "add_generation_prompt", "chat_template_kwargs",
              "response_format", "tools", "tool_choice", "parallel_tool_calls", "logprobs", "top_logprobs")


class ChatError(ValueError):
    """A chat body the engine cannot take; `param` names the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def checkpoint_template(weights: str | None) -> str | None:
    """The chat template a checkpoint directory ships, if any."""
    if not weights:
        return None
    d = Path(weights)
    jinja = d / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    cfg = d / "tokenizer_config.json"
    if cfg.is_file():
        try:
            t = json.loads(cfg.read_text()).get("chat_template")
        except ValueError:
            return None
        if isinstance(t, list):  # named templates: the default one
            t = next((x.get("template") for x in t if isinstance(x, dict) and x.get("name") == "default"), None)
        return t if isinstance(t, str) else None
    return None


class ChatTemplate:
    def __init__(self, source: str, origin: str) -> None:
        self.source = source
        self.origin = origin  # "checkpoint" or "preset"

    @classmethod
    def for_weights(cls, weights: str | None) -> ChatTemplate:
        own = checkpoint_template(weights)
        return cls(own, "checkpoint") if own else cls(CHAT_TEMPLATE, "preset")

    @cached_property
    def _compiled(self) -> Any:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        return env.from_string(self.source)

    def render(self, messages: list[dict[str, str]], *, add_generation_prompt: bool = True) -> str:
        from jinja2 import TemplateError

        try:
            return str(self._compiled.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                             bos_token="", eos_token=""))
        except TemplateError as exc:
            raise ChatError(f"the {self.origin}'s chat template failed on these messages: {exc}",
                            "messages") from None


def messages_of(body: dict[str, Any]) -> list[dict[str, str]]:
    """The messages as role/content strings (content parts of type text are joined)."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ChatError("messages must be a non-empty list of {role, content} objects", "messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ChatError(f"messages[{i}] must be an object with a string role", "messages")
        c = m.get("content")
        if c is None:
            c = ""
        elif isinstance(c, list):
            parts = []
            for p in c:
                if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                    raise ChatError(f"messages[{i}].content: only text parts are supported", "messages")
                parts.append(p["text"])
            c = "".join(parts)
        elif not isinstance(c, str):
            raise ChatError(f"messages[{i}].content must be a string or a list of text parts", "messages")
        out.append({"role": m["role"], "content": c})
    return out


def completion_body(body: Any, template: ChatTemplate) -> dict[str, Any]:
    """The /v1/completions body that generates this chat request's answer."""
    if not isinstance(body, dict):
        raise ChatError("the request body must be a JSON object", "messages")
    if body.get("logprobs") or body.get("tools"):
        raise ChatError("logprobs and tools are not supported", "logprobs" if body.get("logprobs") else "tools")
    gen = body.get("add_generation_prompt", True)
    prompt = template.render(messages_of(body), add_generation_prompt=bool(gen))
    out = {k: v for k, v in body.items() if k not in _CHAT_ONLY}
    limit = body.get("max_completion_tokens")
    if limit is not None:
        out["max_tokens"] = limit
    out["prompt"] = prompt
    return out


def chunk(cid: str, created: int, model: str, index: int, *, text: str | None = None, role: bool = False,
          finish_reason: str | None = None) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if role:
        delta["role"] = "assistant"
    if text is not None:
        delta["content"] = text
    return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}


def whole(cid: str, model: str, texts: list[str], reasons: list[str | None], usage: dict[str, int]) -> dict[str, Any]:
    return {"id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": i, "message": {"role": "assistant", "content": t}, "logprobs": None,
                         "finish_reason": r} for i, (t, r) in enumerate(zip(texts, reasons, strict=True))],
            "usage": usage}
