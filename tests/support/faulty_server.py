"""A tiny OpenAI-ish server that fails on purpose, for process-lifecycle tests (stdlib only: starts fast).

    python tests/support/faulty_server.py --port N --mode MODE [--die-after-requests K] [--ready-delay-s S]

Modes:
  ok            serve /health, /metrics, /v1/models and /v1/completions (streaming or not)
  oom           print a CUDA out-of-memory traceback and exit 1 (before ready)
  nokvcache     print vLLM's "No available memory for the cache blocks" ValueError and exit 1
  valueerror    raise a ValueError at start-up (a config the engine rejects)
  hang          print a loading line and never listen
  die           become ready, then exit 3 after --die-after-requests completions (mid-run crash)
  http500       become ready, answer every completion with HTTP 500 (its message: --error-message)
  ignore-term   like ok, but ignore SIGTERM (teardown must escalate to SIGKILL)
  spawn-child   like ok, but first start a grandchild (`sleep`) in the same process group; its PID is
                written to --child-pid-file
Unknown flags make argparse exit 2 with "error: unrecognized arguments" (the invalid-config case), and a
--port already bound fails with "Address already in use".
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MODES = ("ok", "oom", "nokvcache", "valueerror", "hang", "die", "http500", "ignore-term", "spawn-child")

OOM_TEXT = """Traceback (most recent call last):
  File "/opt/vllm/vllm/worker/gpu_worker.py", line 231, in determine_available_memory
    self.model_runner.profile_run()
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB \
of which 1.02 GiB is free. Including non-PyTorch memory, this process has 78.12 GiB memory in use."""

NOKV_TEXT = """Traceback (most recent call last):
  File "/opt/vllm/vllm/v1/core/kv_cache_utils.py", line 692, in check_enough_kv_cache_memory
    raise ValueError(
ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when \
initializing the engine."""


class State:
    completions = 0
    lock = threading.Lock()


def make_handler(args: argparse.Namespace) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *a: object) -> None:  # keep the log small
            pass

        def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/health":
                self._send(200, b"")
            elif self.path == "/metrics":
                self._send(200, b"vllm:num_requests_running 0\n", "text/plain; version=0.0.4")
            elif self.path == "/v1/models":
                self._send(200, json.dumps({"object": "list", "data": [{"id": args.model}]}).encode())
            else:
                self._send(404, b'{"error": {"message": "not found"}}')

        def do_POST(self) -> None:  # noqa: N802
            n = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(n) or b"{}")
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                self._send(404, b'{"error": {"message": "not found"}}')
                return
            if args.mode == "http500":
                err = {"error": {"message": args.error_message, "type": "InternalServerError"}}
                self._send(500, json.dumps(err).encode())
                return
            with State.lock:
                State.completions += 1
                count = State.completions
            if args.mode == "die" and count > args.die_after_requests:
                sys.stdout.write("RuntimeError: engine core died unexpectedly\n")
                sys.stdout.flush()
                os._exit(3)
            max_tokens = int(body.get("max_tokens") or 4)
            usage = {"prompt_tokens": 4, "completion_tokens": max_tokens, "total_tokens": 4 + max_tokens}
            if not body.get("stream"):
                out = {"id": f"cmpl-{count}", "object": "text_completion", "model": args.model,
                       "choices": [{"index": 0, "text": "x" * max_tokens, "finish_reason": "length"}],
                       "usage": usage}
                self._send(200, json.dumps(out).encode())
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            for i in range(max_tokens):
                time.sleep(args.itl_ms / 1000.0)
                chunk = {"id": f"cmpl-{count}", "object": "text_completion", "model": args.model,
                         "choices": [{"index": 0, "text": "x",
                                      "finish_reason": "length" if i == max_tokens - 1 else None}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            if (body.get("stream_options") or {}).get("include_usage"):
                chunk = {"id": f"cmpl-{count}", "object": "text_completion", "model": args.model,
                         "choices": [], "usage": usage}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

    return Handler


def main() -> None:
    p = argparse.ArgumentParser(prog="faulty_server")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--mode", choices=MODES, default="ok")
    p.add_argument("--model", default="fake")
    p.add_argument("--die-after-requests", type=int, default=2)
    p.add_argument("--ready-delay-s", type=float, default=0.0)
    p.add_argument("--itl-ms", type=float, default=1.0)
    p.add_argument("--child-pid-file", default=None)
    p.add_argument("--pid-file", default=None)
    p.add_argument("--error-message", default="internal error", help="http500: the error's message")
    args = p.parse_args()

    if args.pid_file:
        Path(args.pid_file).write_text(str(os.getpid()))
    print(f"faulty_server pid={os.getpid()} mode={args.mode} "
          f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')}", flush=True)
    if args.mode == "oom":
        print(OOM_TEXT, flush=True)
        sys.exit(1)
    if args.mode == "nokvcache":
        print(NOKV_TEXT, flush=True)
        sys.exit(1)
    if args.mode == "valueerror":
        raise ValueError("max_num_batched_tokens (16) must be greater than or equal to max_num_seqs (256)")
    if args.mode == "hang":
        print("loading model weights ...", flush=True)
        while True:
            time.sleep(3600)
    if args.mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.mode == "spawn-child":
        child = subprocess.Popen(["sleep", "600"])  # inherits our process group
        if args.child_pid_file:
            Path(args.child_pid_file).write_text(str(child.pid))
    if args.ready_delay_s:
        time.sleep(args.ready_delay_s)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(args))
    server.daemon_threads = True
    print(f"listening on http://{args.host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
