"""The scenario table `tuner status` and `tuner report` show: per scenario its bounds, whether it is in service,
its champion (the knobs that differ from the baseline), the workload its study tunes on, and from the last
cross-evaluation (tuner.scenarios.matrix) its champion's gain over the baseline and over each other scenario's
champion measured on this scenario's traffic, each with its interval. Reads files only."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from tuner.agent import Agent
from tuner.scenarios.store import ScenarioBook


def bounds_text(bounds: dict[str, Any]) -> str:
    parts = []
    for dim, b in bounds.items():
        lo, hi = b.get("min"), b.get("max")
        if lo is not None and hi is not None:
            parts.append(f"{lo:g} <= {dim} <= {hi:g}")
        elif lo is not None:
            parts.append(f"{dim} >= {lo:g}")
        else:
            parts.append(f"{dim} <= {hi:g}")
    return ", ".join(parts)


def gain_text(g: dict[str, Any] | None) -> str:
    """'+12.3% [+5.1%, +19.9%]' (or why there is none)."""
    if not g:
        return "-"
    if g.get("note") and g.get("improvement") in (None, 0.0) and g.get("low") in (None, 0.0):
        return "0 (same configuration)" if g.get("improvement") == 0.0 else str(g["note"])
    est, low, high = g.get("improvement"), g.get("low"), g.get("high")
    if est is None:
        return "-"
    hi = "inf" if high is None or not math.isfinite(high) else f"{high:+.1%}"
    return f"{est:+.1%} [{low:+.1%}, {hi}]"


def scenario_study(agent: Agent, state_dir: Path, scenario: str | None = None) -> str | None:
    """The study a report or status shows for `scenario` (None: the one in service, else the first scenario
    that has a study). None when there is none."""
    book = ScenarioBook(state_dir, agent.name)
    names = [s.name for s in book.all(agent.spec)]
    if scenario is not None:
        if scenario not in names:
            from tuner.errors import ConfigError

            raise ConfigError(f"{agent.name} has no scenario {scenario!r} (known: {', '.join(names) or 'none'})")
        return book.current_study(scenario)
    service = (book.service() or {}).get("scenario")
    for name in ([service] if service in names else []) + names:
        study = book.current_study(name)
        if study is not None:
            return study
    return None


def scenario_rows(agent: Agent, state_dir: Path) -> list[dict[str, Any]]:
    """One row per scenario (declared, then proposed); [] when the agent has none."""
    book = ScenarioBook(state_dir, agent.name)
    scenarios = book.all(agent.spec)
    if not scenarios:
        return []
    declared = {s.name for s in agent.spec.scenarios}
    service = book.service() or {}
    matrix = book.matrix() or {}
    space = agent.space
    baseline = space.full_config(space.defaults())
    rows = []
    for s in scenarios:
        champ = book.champions(s.name).champion()
        fitted = book.fitted(s.name)
        obs = (fitted or {}).get("observation") or {}
        gains = (matrix.get("gains") or {}).get(s.name) or {}
        vs = gains.get("vs") or {}
        rows.append({
            "scenario": s.name, "origin": "declared" if s.name in declared else "proposed",
            "bounds": bounds_text({d: b.model_dump() for d, b in s.bounds().items()}),
            "in_service": service.get("scenario") == s.name, "service_since": service.get("since")
            if service.get("scenario") == s.name else None,
            "study": book.current_study(s.name),
            "champion": None if champ is None else {
                "seq": champ.seq, "trial": champ.trial, "study": champ.study, "values": champ.values,
                "verified": champ.verified, "config": champ.config,
                "changed": {k: v for k, v in champ.config.items() if baseline.get(k) != v}},
            "workload": {"source": "observed" if obs else ("declared" if s.workload is not None else None),
                         "stats": obs.get("stats") or {}, "window_s": obs.get("window_s")},
            "gain_vs_baseline": vs.get("baseline"), "gain_vs": {k: v for k, v in vs.items() if k != "baseline"},
            "measured_own": gains.get("own"), "matrix_time": matrix.get("time"),
        })
    return rows


TRAFFIC_KEYS = ("rate_per_s", "concurrency_mean", "prompt_tokens_mean", "output_tokens_mean")


def stats_text(stats: dict[str, Any]) -> str:
    """'rate_per_s 12.3, concurrency_mean 8, ...' of an observation's statistics ('' when it has none)."""
    return ", ".join(f"{k} {stats[k]:.3g}" for k in TRAFFIC_KEYS if isinstance(stats.get(k), int | float))


def traffic_text(entry: dict[str, Any]) -> str:
    """Which traffic a cycle tuned for, in words: 'scenario busy, observed workload (rate_per_s 12.3, ...)'."""
    where = f"scenario {entry['scenario']}, " if entry.get("scenario") else ""
    shown = stats_text((entry.get("observed") or {}).get("stats") or {})
    return where + f"{entry.get('workload_source', 'agent')} workload" + (f" ({shown})" if shown else "")
