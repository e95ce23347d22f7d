"""What a tracking backend that does not answer costs the tuner: the first write, the next 100 writes, the
end-of-cycle probe (Tracker.probe_now), a second tracker of the same process (the daemon's next cycle), and
whole cycles of a sim agent (3 trials) against that backend minus the same cycles with tracking off.

    .venv/bin/python experiments/fault-campaign/tracking_cost.py [--call-timeout-s 30] [--end-probe-s 10]

Backends: a TCP port that accepts and never answers (a hung server), a closed port, a PostgreSQL URI with
nothing listening. Prints a Markdown table (the README keeps the one measured last).
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.support.agents import agent_spec, write_spec  # noqa: E402

# the factory's sim agent: one knob, Poisson arrivals at 20 req/s, no SLO, a budget of 100 trials
AGENT = agent_spec(
    name="cost", slos=None, sampler={"name": "random", "seed": 1}, budget={"trials": 100},
    search_space={"params": {"max_num_seqs": {"type": "int", "low": 8, "high": 512, "log": True, "default": 256}}},
    workload={"arrival": {"kind": "poisson", "rate_per_s": 20}, "prompt_tokens": {"dist": "fixed", "value": 128},
              "output_tokens": {"dist": "fixed", "value": 32}, "num_requests": 60})


def _cycles(uri: str | None, work: Path, label: str, n: int, call_timeout_s: float, end_probe_s: float) -> list[float]:
    """Wall seconds of `n` cycles (3 trials each, a new tracker per cycle as the daemon makes them)."""
    from tuner.agent import load_agent
    from tuner.loop import open_session, run_cycle
    from tuner.tracking.tracker import Tracker

    d = work / label
    d.mkdir()
    write_spec(d / "agent.yaml", AGENT)
    out = []
    for _ in range(n):
        tracker = Tracker(uri or "sqlite:///unused.db", "cost", enabled=uri is not None, pause_s=5.0,
                          call_timeout_s=call_timeout_s, end_probe_s=end_probe_s)
        t0 = time.monotonic()
        session = open_session(load_agent(d / "agent.yaml"), d / "state", tracker=tracker)
        run_cycle(session, trials=3)
        out.append(time.monotonic() - t0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--call-timeout-s", type=float, default=30.0)
    ap.add_argument("--end-probe-s", type=float, default=10.0)
    a = ap.parse_args()
    from tuner.tracking.tracker import Tracker

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    backends = {"silent HTTP server (accepts, never answers)": f"http://127.0.0.1:{silent.getsockname()[1]}",
                "closed port": f"http://127.0.0.1:{closed}",
                "PostgreSQL URI, nothing listening": f"postgresql+psycopg://tuner@127.0.0.1:{closed}/mlflow"}
    rows = []
    with tempfile.TemporaryDirectory(prefix="tracking-cost-") as tmp:
        work = Path(tmp)
        base = _cycles(None, work, "off", 3, a.call_timeout_s, a.end_probe_s)
        for i, (name, uri) in enumerate(backends.items()):
            tr = Tracker(uri, f"x{i}", call_timeout_s=a.call_timeout_s, pause_s=600, end_probe_s=a.end_probe_s)
            t0 = time.monotonic()
            tr.start_run("first")
            first_s = time.monotonic() - t0
            t0 = time.monotonic()
            for j in range(100):
                tr.start_run(f"next-{j}")
            next_ms = (time.monotonic() - t0) * 1000
            t0 = time.monotonic()
            tr.probe_now()
            probe_s = time.monotonic() - t0
            second = Tracker(uri, f"x{i}", call_timeout_s=a.call_timeout_s, pause_s=600)
            t0 = time.monotonic()
            second.start_run("second tracker")
            second_ms = (time.monotonic() - t0) * 1000
            from tuner.tracking import tracker as tracking

            tracking._DOWN_URIS.clear()  # the first cycle finds the outage itself, as a fresh daemon would
            cycles = _cycles(uri, work, f"b{i}", 3, a.call_timeout_s, a.end_probe_s)
            extra = [c - b for c, b in zip(cycles, base, strict=True)]
            rows.append((name, f"{first_s:.1f} s", f"{next_ms:.1f} ms", f"{probe_s:.1f} s", f"{second_ms:.1f} ms",
                         ", ".join(f"{x:+.1f} s" for x in extra)))
            print(rows[-1], flush=True)
    silent.close()
    print(f"\ncall_timeout_s {a.call_timeout_s:g}, end_probe_s {a.end_probe_s:g}; cycles with tracking off: "
          + ", ".join(f"{b:.1f} s" for b in base) + "\n")
    print("| backend | first write | the next 100 writes | end-of-cycle probe | a second tracker's first write "
          "| 3 cycles of 3 trials, each minus the same cycle untracked |\n|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
