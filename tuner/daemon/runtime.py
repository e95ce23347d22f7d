"""The daemon's per-process state: one Runtime, one AgentState per agent, GPU groups."""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.daemon.metrics import DaemonMetrics

if TYPE_CHECKING:
    from apscheduler.schedulers.base import BaseScheduler

HEARTBEAT_INTERVAL_S = 2.0


def job_id(agent_name: str) -> str:
    return f"cycle:{agent_name}"


def daemon_dir(state_dir: Path) -> Path:
    d = Path(state_dir) / "daemon"
    d.mkdir(parents=True, exist_ok=True)
    return d


@dataclass
class AgentState:
    name: str
    path: Path
    running: bool = False
    cycles: int = 0
    last_ok: bool | None = None
    last_error: str | None = None
    last_end: float | None = None
    last_result: dict[str, Any] = field(default_factory=dict)
    schedule: str = ""  # the trigger in force, as text (a reload compares it)
    watch: dict[str, Any] | None = None  # the watch in force
    watch_stop: threading.Event | None = None  # ends the running watch thread
    gpus: list[int] | None = None
    observed: Any = None  # the latest ObservedWorkload of the watch's window (tuner.observe), or None
    tune_scenario: str | None = None  # the scenario the switcher asked a cycle for (the next cycle tunes it)


@dataclass
class Runtime:
    state_dir: Path
    stop: threading.Event
    agents: dict[str, AgentState]
    locks: dict[str, threading.Lock]  # agent name -> lock of its GPU group
    metrics: DaemonMetrics
    grace_s: float
    port: int | None = None
    scheduler: BaseScheduler | None = None
    mutex: threading.Lock = field(default_factory=threading.Lock)
    idle: threading.Condition = field(default_factory=threading.Condition)
    in_flight: int = 0

    def healthy(self) -> bool:
        return not any(a.last_ok is False for a in self.agents.values())

    def snapshot(self) -> dict[str, Any]:
        from tuner.base.proc import process_start_ticks

        return {"pid": os.getpid(), "pid_start_ticks": process_start_ticks(os.getpid()), "host": socket.gethostname(),
                "time": time.time(), "port": self.port, "interval_s": HEARTBEAT_INTERVAL_S,
                "stopping": self.stop.is_set(), "healthy": self.healthy(),
                "agents": {n: {"running": a.running, "cycles": a.cycles, "last_ok": a.last_ok,
                               "last_error": a.last_error, "last_end": a.last_end}
                           for n, a in self.agents.items()}}


_CURRENT: list[Runtime] = []  # the running daemon's Runtime (at most one per process)


def current() -> Runtime | None:
    return _CURRENT[-1] if _CURRENT else None


def install(rt: Runtime | None) -> None:
    """Make `rt` the process's runtime (None: there is none)."""
    _CURRENT.clear()
    if rt is not None:
        _CURRENT.append(rt)


def gpu_groups(specs: dict[str, list[int] | None]) -> dict[str, str]:
    """Agents whose GPU sets intersect (None: all GPUs) share a group. Returns agent -> group key."""
    names = list(specs)
    parent = {n: n for n in names}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i, a in enumerate(names):
        for b in names[i + 1:]:
            ga, gb = specs[a], specs[b]
            if ga is None or gb is None or set(ga) & set(gb):
                parent[find(a)] = find(b)
    return {n: find(n) for n in names}
