"""The one logging set-up, used by the `tuner` CLI, `python -m tuner.cli.ops` and so the daemon.

Only command-line entry points call it: library code only logs.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from tuner.base.redact import redact_text
from tuner.base.textfmt import log_handler

QUIET_LOGGERS = ("alembic", "mlflow", "httpx", "aiohttp.access", "optuna", "filelock")
# INFO from these: a line per finished trial and per cycle, lineage changes, promotions
PROGRESS_LOGGERS = ("tuner.loop", "tuner.daemon", "tuner.study.lineage", "tuner.context", "tuner.promotion",
                    "tuner.cli.bench", "tuner.study.sizing")


class RedactFilter(logging.Filter):
    """Every log line through the one redaction (tuner.base.redact): a URL's password and secret query parameters
    are hidden in the message and in the traceback, whoever logs it (the tuner, MLflow, httpx, a server's argv
    in a `starting server` line, an exception's text)."""

    _formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string is logging's own error to report
            return True
        clean = redact_text(msg)
        if clean != msg:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = self._formatter.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        if record.stack_info:
            record.stack_info = redact_text(record.stack_info)
        return True


def redact_handlers(logger: logging.Logger | None = None) -> None:
    """Put the RedactFilter on every handler of `logger` (default: the root logger), once."""
    for h in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, RedactFilter) for f in h.filters):
            h.addFilter(RedactFilter())


def configure_logging(verbose: bool = False, *, rich_console: Any = None) -> None:
    """The one logging set-up (the CLI, `python -m tuner.cli.ops`, the daemon): the tuner's INFO (a line per
    finished trial and per cycle) and everyone's warnings on stderr; -v: everything. The handler is
    tuner.base.textfmt's (rich on a terminal when a console is given, plain lines otherwise, JSON with
    TUNER_LOG_FORMAT=json). Third-party chatter stays at WARNING. A second call adds no second handler. Every
    handler of the root logger redacts URLs (RedactFilter)."""
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(log_handler(sys.stderr, rich_console=rich_console))
    redact_handlers(root)
    logging.captureWarnings(True)  # warnings.warn (MLflow's, urllib3's) as WARNING lines, through the redaction
    root.setLevel(logging.DEBUG if verbose else logging.WARNING)
    for name in PROGRESS_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.INFO)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("urllib3").setLevel(logging.ERROR)  # MLflow's HTTP retries; the tracker says it once
