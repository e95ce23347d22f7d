"""The reference engine (tiny preset, CPU) as a real subprocess with a step log: its Prometheus counters, raw
requests on sockets a caller can close mid-request, and whether its log stayed free of tracebacks. Used by
tests/integration/engine/test_client_disconnect.py and the fault campaign's abandon and unicode parts."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from tuner.base.proc import free_port

WAIT_S = 120.0  # generous: a bound for what takes well under a second on a quiet machine


class EngineProcess:
    def __init__(self, work: Path, *, max_batch_size: int = 8, cwd: Path | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.steps, self.log = work / "steps.jsonl", work / "server.log"
        with open(self.log, "wb") as f:
            self.proc = subprocess.Popen([sys.executable, "-m", "tuner.engine.server", "--port", str(self.port),
                                          "--cpu-threads", "1", "--max-batch-size", str(max_batch_size),
                                          "--step-log", str(self.steps)], cwd=cwd, stdout=f, stderr=subprocess.STDOUT)
        end = time.monotonic() + WAIT_S
        while True:
            if self.proc.poll() is not None or time.monotonic() > end:
                self.stop()
                raise RuntimeError("engine not ready: " + self.log.read_text()[-2000:])
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.1)

    def metric(self, name: str) -> float:
        """A series summed over its labels (0 when absent)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=WAIT_S) as r:
            text = r.read().decode()
        return sum(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith((name + "{", name + " ")))

    def busy(self) -> float:
        """Sequences running or waiting."""
        return self.metric("vllm:num_requests_running") + self.metric("vllm:num_requests_waiting")

    def post(self, path: str, body: dict[str, Any] | bytes) -> socket.socket:
        """Send a POST on a socket of its own and return the socket (unread)."""
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        s = socket.create_connection(("127.0.0.1", self.port), timeout=WAIT_S)
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: engine\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(raw)}\r\n\r\n".encode() + raw)
        return s

    def step_count(self) -> int:
        return self.steps.read_text().count("\n") if self.steps.exists() else 0

    def served_alone(self) -> str | None:
        """Serve a short request (8 tokens): None when it finished and every engine step while it ran carried it
        alone, else what went wrong."""
        before = self.step_count()
        req = urllib.request.Request(self.url + "/v1/completions", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"prompt": "next", "max_tokens": 8, "ignore_eos": True}).encode())
        with urllib.request.urlopen(req, timeout=WAIT_S) as r:
            choice = json.loads(r.read())["choices"][0]
        if choice["finish_reason"] != "length":
            return f"the request ended {choice['finish_reason']}"
        steps = [json.loads(line) for line in self.steps.read_text().splitlines()[before:]]
        if not steps:
            return "the step log shows no step for the request"
        if max(s["running"] + s["waiting"] for s in steps) > 1:
            return "the request shared the engine with others"
        if len(steps) > 8 + 3:
            return f"{len(steps)} engine steps for 8 tokens"
        return None

    def stop(self) -> bool:
        """SIGTERM (SIGKILL after 30 s); True when the log holds no traceback."""
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return "Traceback" not in self.log.read_text()
