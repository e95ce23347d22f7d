"""The agent's apply command: restart the production server on its port with the configuration of the champion
file (TUNER_CHAMPION_FILE), as an operator's deploy hook would. The server's pid is kept in `--pidfile`.

    python apply.py --port 8123 --pidfile prod.pid [--config-json '{...}']   (no champion file: that config)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DEFAULTS, server_argv, wait_ready  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
KNOBS = set(DEFAULTS)


def restart(config: dict, port: int, pidfile: Path, log: Path) -> None:
    if pidfile.is_file():
        pid = int(pidfile.read_text())
        try:
            os.kill(pid, signal.SIGTERM)
            for _ in range(300):
                os.kill(pid, 0)
                time.sleep(0.1)
        except ProcessLookupError:
            pass
    with open(log, "ab") as out:
        proc = subprocess.Popen(server_argv(config, port), stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                start_new_session=True)  # outlives this hook
    pidfile.write_text(str(proc.pid))
    wait_ready(f"http://127.0.0.1:{port}", proc)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pidfile", type=Path, required=True)
    ap.add_argument("--log", type=Path, required=True)
    ap.add_argument("--config-json")
    args = ap.parse_args()
    if args.config_json:
        config = json.loads(args.config_json)
    else:
        config = yaml.safe_load(Path(os.environ["TUNER_CHAMPION_FILE"]).read_text())["config"]
    restart({k: v for k, v in {**DEFAULTS, **config}.items() if k in KNOBS}, args.port, args.pidfile, args.log)
    print(f"production server on :{args.port} restarted with {config}")


if __name__ == "__main__":
    main()
