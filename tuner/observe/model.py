"""The result of an observation (`ObservedWorkload`) and what a window's signals add up to (`WindowCounts`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from tuner.errors import ObservationError
from tuner.spec import WorkloadSpec

# WorkloadSpec fields written even at their defaults (what the observation decided)
_ALWAYS = ("arrival", "prompt_tokens", "output_tokens", "num_requests", "duration_s")


@dataclass
class LengthHist:
    """A length histogram: ascending upper bounds (the last may be +inf) with cumulative counts, the sum and
    the count (Prometheus' `_bucket{le}`, `_sum`, `_count` over a window)."""

    bounds: list[float]
    cum: list[float]
    sum: float
    count: float

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count > 0 else math.nan


@dataclass
class WindowCounts:
    """What the signals of one window add up to, whichever server or Prometheus they came from.

    `interval_counts` are (seconds, finished requests) per scrape interval, for the burstiness; `running` and
    `waiting` are the gauge samples of the window (sums over replicas)."""

    start_s: float
    end_s: float
    requests: float
    prompt: LengthHist
    output: LengthHist
    running: list[float] = field(default_factory=list)
    waiting: list[float] = field(default_factory=list)
    interval_counts: list[tuple[float, float]] = field(default_factory=list)
    prefix_queries: float | None = None
    prefix_hits: float | None = None


@dataclass
class ObservedWorkload:
    """A workload model fitted to (or replaying) what production showed over [start_s, end_s] (unix seconds).

    `stats`: what was observed (requests, rate_per_s, burstiness, concurrency, lengths, prefix-cache hit rate);
    `fit_error`: how far the fitted workload lies from it (`*_mean_rel_err`, `*_bucket_ks`: the largest
    difference of the cumulative distributions at the observed bucket bounds); `replay`: the exact requests
    (arrival s from the first, prompt tokens, output tokens) when the workload replays a trace."""

    workload: WorkloadSpec
    start_s: float
    end_s: float
    source: str
    stats: dict[str, float]
    fit_error: dict[str, float]
    notes: list[str] = field(default_factory=list)
    replay: list[tuple[float, int, int]] | None = None

    @property
    def window_s(self) -> float:
        return self.end_s - self.start_s

    def to_dict(self) -> dict[str, Any]:
        dumped = self.workload.model_dump(mode="json", exclude_none=True)
        default = WorkloadSpec(num_requests=1).model_dump(mode="json", exclude_none=True)
        wl = {k: v for k, v in dumped.items() if k in _ALWAYS or default.get(k) != v}
        if wl["arrival"].get("kind") != "gamma":
            wl["arrival"].pop("burstiness", None)  # the gamma shape: of no other process
        return {
            "workload": wl,
            "observation": {
                "source": self.source,
                "start_s": round(self.start_s, 3),
                "end_s": round(self.end_s, 3),
                "start": _iso(self.start_s),
                "end": _iso(self.end_s),
                "window_s": round(self.window_s, 3),
                "stats": {k: _num(v) for k, v in self.stats.items()},
                "fit_error": {k: _num(v) for k, v in self.fit_error.items()},
                "notes": list(self.notes),
            },
        }

    def to_yaml(self) -> str:
        head = (f"# observed by tuner observe from {self.source}, {_iso(self.start_s)} .. {_iso(self.end_s)};\n"
                "# `workload:` is a WorkloadSpec (an agent's workload, or tuner bench --workload THIS_FILE)\n")
        return head + yaml.safe_dump(self.to_dict(), sort_keys=False, width=110)

    def save(self, path: Path) -> list[Path]:
        """Write the YAML to `path` (and, for a replay, the trace next to it, named in the workload relative
        to the YAML's folder, as the loaders resolve it); returns the files written."""
        from tuner.base.files import atomic_write

        written = []
        obs = self
        if self.replay is not None:
            trace = path.with_name(path.stem + ".trace.jsonl")
            atomic_write(trace, replay_jsonl(self.replay))
            written.append(trace)
            arrival = self.workload.arrival.model_copy(update={"trace": trace.name})
            obs = ObservedWorkload(self.workload.model_copy(update={"arrival": arrival}), self.start_s, self.end_s,
                                   self.source, self.stats, self.fit_error, self.notes, self.replay)
        atomic_write(path, obs.to_yaml())
        return [path, *written]

    @classmethod
    def from_dict(cls, data: Any, *, file: str = "<observation>") -> ObservedWorkload:
        if not isinstance(data, dict) or not isinstance(data.get("workload"), dict):
            raise ObservationError("not an observation: expected a mapping with `workload:` and `observation:`",
                                   file=file)
        obs = data.get("observation") or {}
        try:
            wl = WorkloadSpec.model_validate(data["workload"])
        except ValidationError as exc:
            raise ObservationError(f"workload: {exc.errors()[0]['msg']}", file=file) from None
        try:
            return cls(workload=wl, start_s=float(obs.get("start_s", 0.0)), end_s=float(obs.get("end_s", 0.0)),
                       source=str(obs.get("source", "")),
                       stats={str(k): float(v) for k, v in (obs.get("stats") or {}).items()},
                       fit_error={str(k): float(v) for k, v in (obs.get("fit_error") or {}).items()},
                       notes=[str(n) for n in obs.get("notes") or []])
        except (TypeError, ValueError, AttributeError) as exc:
            raise ObservationError(f"observation: {exc}", file=file) from None


def load_observed(path: Path) -> ObservedWorkload:
    """Read a file `tuner observe --out` wrote (a replay's trace stays where the workload names it)."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ObservationError(f"cannot read: {exc}", file=str(path)) from None
    return ObservedWorkload.from_dict(data, file=str(path))


def replay_jsonl(rows: list[tuple[float, int, int]]) -> str:
    """The tuner's trace JSONL (tuner.measure.datasets.load_trace reads it) for exact requests."""
    import json

    return "".join(json.dumps({"timestamp": round(t, 6), "prompt_tokens": p, "output_tokens": o}) + "\n"
                   for t, p, o in rows)


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _num(v: float) -> float:
    return float(f"{v:.6g}") if math.isfinite(v) else v
