"""A stand-in for a tuner process: starts one server through ServerProcess, then waits to be killed.

    python tests/support/fault_host.py STATE_DIR INFO_FILE [server args ...]

Writes {"server_pid": ..., "host_pid": ...} to INFO_FILE once the server is ready, then sleeps. The test
SIGKILLs this process and checks that the server did not outlive it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from tuner.targets.process import ServerProcess, free_port


def main() -> None:
    state_dir, info_file, *server_args = sys.argv[1:]
    port = free_port()
    argv = [sys.executable, str(Path(__file__).with_name("faulty_server.py")), "--port", str(port), *server_args]
    server = ServerProcess(argv, log_path=Path(state_dir) / "logs" / "host-server.log",
                           state_dir=Path(state_dir), health_url=f"http://127.0.0.1:{port}/health")
    server.start()
    server.wait_ready(30)
    tmp = Path(info_file + ".tmp")
    tmp.write_text(json.dumps({"server_pid": server.pid, "host_pid": os.getpid()}))
    tmp.replace(info_file)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
