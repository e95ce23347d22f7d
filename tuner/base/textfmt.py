"""How numbers, times, tables and log lines look to an operator: in a terminal, in a pipe, in a log file."""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

# a table printed into a pipe or a file is not cut at rich's default 80 columns
PIPE_WIDTH = 240


def fmt(v: Any) -> str:
    """4 significant digits without an exponent for everyday magnitudes (15,130, 0.0123), '' for none."""
    if v is None:
        return ""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return str(v)
    if isinstance(v, int):
        return str(v)
    if not math.isfinite(v):
        return str(v)
    a = abs(v)
    if a == 0:
        return "0"
    if a >= 1e7 or a < 1e-4:
        return f"{v:.4g}"
    if a >= 1000:
        return f"{v:,.0f}"
    return f"{v:.4g}"  # no exponent between 1e-4 and 1000


def when(t: float | None) -> str:
    """A Unix time as local time with its zone, or '-'."""
    if not t:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(t))


def age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def console_width(stream: TextIO) -> int | None:
    """None (rich measures the terminal) on a terminal or when COLUMNS is set; else wide enough for tables."""
    isatty = getattr(stream, "isatty", None)
    if (isatty is not None and isatty()) or os.environ.get("COLUMNS"):
        return None
    return PIPE_WIDTH


def params_text(params: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={fmt(v) if isinstance(v, float) else v}" for k, v in params.items())


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (ISO 8601, UTC), level, logger, message (and the exception, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
               "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        if record.exc_info or record.exc_text:  # exc_text: the traceback as tuner.base.logs redacted it
            out["exception"] = record.exc_text or self.formatException(record.exc_info)  # type: ignore[arg-type]
        return json.dumps(out, default=str)


PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def log_handler(stream: TextIO | None = None, *, rich_console: Any = None) -> logging.Handler:
    """The handler for the tuner's log lines. TUNER_LOG_FORMAT: `json`, `plain`, or `rich` (default: rich on a
    terminal, plain otherwise: a log file or a journal gets whole lines, never wrapped at 80 columns)."""
    stream = stream or sys.stderr
    choice = os.environ.get("TUNER_LOG_FORMAT", "").strip().lower()
    if not choice:
        choice = "rich" if getattr(stream, "isatty", lambda: False)() and rich_console is not None else "plain"
    if choice == "json":
        h: logging.Handler = logging.StreamHandler(stream)
        h.setFormatter(JsonFormatter())
        return h
    if choice == "rich" and rich_console is not None:
        from rich.logging import RichHandler

        return RichHandler(console=rich_console, show_path=False, rich_tracebacks=False)
    h = logging.StreamHandler(stream)
    h.setFormatter(logging.Formatter(PLAIN_FORMAT))
    return h
