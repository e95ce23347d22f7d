"""The one logging set-up, used by the `tuner` CLI, `python -m tuner.cli_ops` and so the daemon.

Only command-line entry points call it: library code only logs.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from tuner.textfmt import log_handler

QUIET_LOGGERS = ("alembic", "mlflow", "httpx", "aiohttp.access", "optuna", "filelock")
# INFO from these: a line per finished trial and per cycle, lineage changes, promotions
PROGRESS_LOGGERS = ("tuner.loop", "tuner.daemon", "tuner.lineage", "tuner.context", "tuner.promote", "tuner.bench",
                    "tuner.sizing")


def configure_logging(verbose: bool = False, *, rich_console: Any = None) -> None:
    """The one logging set-up (the CLI, `python -m tuner.cli_ops`, the daemon): the tuner's INFO (a line per
    finished trial and per cycle) and everyone's warnings on stderr; -v: everything. The handler is
    tuner.textfmt's (rich on a terminal when a console is given, plain lines otherwise, JSON with
    TUNER_LOG_FORMAT=json). Third-party chatter stays at WARNING. A second call adds no second handler."""
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(log_handler(sys.stderr, rich_console=rich_console))
    root.setLevel(logging.DEBUG if verbose else logging.WARNING)
    for name in PROGRESS_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.INFO)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("urllib3").setLevel(logging.ERROR)  # MLflow's HTTP retries; the tracker says it once
