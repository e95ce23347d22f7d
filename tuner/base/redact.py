"""One redaction for every URL the tuner prints, logs or records: the password of the userinfo, query
parameters that carry a secret (token, key, password, signature...), wherever the URL sits in a text.

    redact_url("postgresql+psycopg://tuner:s3cret@db/optuna")  -> "postgresql+psycopg://tuner:***@db/optuna"
    redact_url("http://host/x?api_key=abc&n=1")                  -> "http://host/x?api_key=***&n=1"
    redact_text("cannot reach http://u:p@host:5000/api (refused)") -> "cannot reach http://u:***@host:5000/api ..."

Keys and tokens passed as names elsewhere (knob values, headers) are `redact_mapping`'s job.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

MASK = "***"
# a name is secret when its last word is one of these (api_key, HF_TOKEN), or it has a password word anywhere;
# knobs that count tokens (max_num_batched_tokens, long_prefill_token_threshold) are not
SECRET_MARKERS = ("key", "token", "secret", "password", "passwd", "pwd", "auth", "authorization", "apikey",
                  "credentials", "credential", "signature", "sig", "sas", "session", "jwt", "bearer",
                  "accesskeyid", "privatekey")
_ALWAYS_SECRET = ("password", "passwd", "secret", "apikey", "credential", "credentials")
# AWS/GCS/Azure signed-URL parameters
_SECRET_PARAMS = {"x-amz-signature", "x-amz-credential", "x-amz-security-token", "x-goog-signature",
                  "x-goog-credential", "sig", "code", "access_token", "refresh_token", "id_token"}

# scheme://userinfo@host ; the userinfo runs to the LAST '@' that a host follows (a password may hold '/', '@',
# '?', '#' or ':' unencoded: "postgresql://u:pa/ss@db/x"); the user name is what stands before its first ':'
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^:/@\s?#]*)(?::(?P<pw>[^\s]*))?@"
                       r"(?=[A-Za-z0-9\[\]._%~-]+(?:[:/?#'\")>,;\s]|$))")
# key=value after ? & or ; in any text (a URL, or a path and query alone, as urllib3 and MLflow print them)
_QUERY_PAIR = re.compile(r"(?P<sep>[?&;])(?P<key>[^=&;#\s'\"<>]+)=(?P<value>[^&;#\s'\"<>]*)")
# password=... and secret=... as libpq's keyword connection strings write them ("host=db password=x")
_KEYWORD_SECRET = re.compile(
    r"(?<![\w.-])(?P<key>[A-Za-z_]*(?:password|passwd|secret)[A-Za-z_]*)=(?P<value>[^\s&;'\"]+)", re.IGNORECASE)


def is_secret_name(name: str) -> bool:
    """Whether a parameter, header or knob name looks like it holds a secret."""
    lowered = name.lower()
    if lowered in _SECRET_PARAMS:
        return True
    words = [w for w in re.split(r"[^a-z0-9]+", lowered) if w]
    return bool(words) and (words[-1] in SECRET_MARKERS or any(w in _ALWAYS_SECRET for w in words))


def _userinfo(m: re.Match[str]) -> str:
    if m.group("pw") is None:
        # a lone userinfo is a token more often than a user name (https://TOKEN@github.com)
        user = m.group("user")
        return f"{m.group('scheme')}{MASK if len(user) >= 16 else user}@"
    return f"{m.group('scheme')}{m.group('user')}:{MASK}@"


def _query(m: re.Match[str]) -> str:
    if is_secret_name(m.group("key")) and m.group("value"):
        return f"{m.group('sep')}{m.group('key')}={MASK}"
    return m.group(0)


def redact_url(url: str) -> str:
    """The URL with its password and secret query parameters replaced by ***."""
    return redact_text(url)


def redact_text(text: str) -> str:
    """Every URL inside a message (an exception's text, a log line) redacted, and every secret query pair
    (`?token=...`, `&api_key=...`) or `password=...` outside a URL too (urllib3 and MLflow print a request's
    path and query without the host)."""
    if not isinstance(text, str):
        return text
    if "://" in text:  # over the whole text, not URL tokens: a password may hold a quote or a '<'
        text = _USERINFO.sub(_userinfo, text)
    if "=" in text:
        text = _QUERY_PAIR.sub(_query, text)
        text = _KEYWORD_SECRET.sub(lambda m: f"{m.group('key')}={MASK}", text)
    return text


def redact_mapping(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """Values whose names look secret hidden; URL values redacted."""
    out: dict[str, Any] = {}
    for k, v in mapping.items():
        if is_secret_name(str(k)):
            out[k] = MASK
        elif isinstance(v, str):
            out[k] = redact_text(v)
        else:
            out[k] = v
    return out
