"""What a run's end says beyond the best trial: the nearest misses when nothing is feasible, failure causes.

Pure functions over a study's trials and the agent spec; the CLI prints them.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tuner.measure.measurement import Measurement
from tuner.spec import SLO, AgentSpec
from tuner.study.objectives import violation

# `tuner run` exit status when the study has no feasible trial (0: it has one; 2: invalid input).
EXIT_NO_FEASIBLE = 3
# `tuner run` exit status when the cycle stopped early: the baseline and the first trials failed for one cause of
# the environment (a port taken, a binary missing, a client error), so no further trial could tell anything
EXIT_ENVIRONMENT = 5
# causes that the environment, not the configuration, may explain, and how many first trials (the baseline
# included) failing with one of them and one error text stop the cycle
ENVIRONMENT_CAUSES = ("deploy_failed", "crashed_at_startup", "startup_timeout", "all_requests_failed",
                      "request_errors", "request_failed", "internal_error", "run_failed", "crashed_during_run")
ENVIRONMENT_STOP_AFTER = 3


def environment_failure(outcomes: Sequence[Any]) -> str | None:
    """A sentence when the first ENVIRONMENT_STOP_AFTER trials (in trial order, the baseline first) all failed
    with one environment cause and the same error text (its first and last lines, digits aside: the last line
    of a server's log tail says why it went); None otherwise."""
    first = sorted(outcomes, key=lambda o: o.number)[:ENVIRONMENT_STOP_AFTER]
    if len(first) < ENVIRONMENT_STOP_AFTER:
        return None
    causes = {o.cause for o in first}
    if len(causes) != 1 or next(iter(causes)) not in ENVIRONMENT_CAUSES:
        return None
    texts = {_signature(o.error) for o in first}
    if len(texts) != 1:
        return None
    cause = next(iter(causes))
    lines = [ln for ln in (first[0].error or "no detail").splitlines() if ln.strip()]
    detail = lines[0][:200] + (f" ... {lines[-1][:200]}" if len(lines) > 1 else "")
    return (f"stopped early: the baseline and the next {ENVIRONMENT_STOP_AFTER - 1} trials all failed with "
            f"{cause} ({detail}): the environment, not the configuration, looks at fault; fix it and run again")


def _signature(error: str | None) -> str:
    import re

    lines = [ln for ln in (error or "").splitlines() if ln.strip()]
    if not lines:
        return ""
    return re.sub(r"\d+", "#", f"{lines[0][:160]}|{lines[-1][:160]}")


@dataclass(frozen=True)
class SloMiss:
    metric: str
    value: float
    limit: float
    bound: str  # "max" or "min"
    excess: float  # relative violation: (value - max) / max, or (min - value) / min; > 0 is broken

    def text(self) -> str:
        unit = " ms" if "_ms" in self.metric else ""
        op = ">" if self.bound == "max" else "<"
        if math.isnan(self.value):
            return f"{self.metric} not measured"
        return f"{self.metric} {self.value:.4g}{unit} {op} {self.limit:.4g}{unit} ({self.excess:+.0%})"


@dataclass(frozen=True)
class NearMiss:
    trial: int
    baseline: bool
    misses: tuple[SloMiss, ...]  # broken SLOs, worst first

    @property
    def worst(self) -> float:
        return self.misses[0].excess if self.misses else 0.0

    def text(self) -> str:
        label = f"trial {self.trial}{' (baseline)' if self.baseline else ''}"
        return f"{label}: " + "; ".join(m.text() for m in self.misses)


def slo_misses(metrics: dict[str, float], slos: Sequence[SLO]) -> list[SloMiss]:
    """The SLOs a measurement broke, worst (largest relative excess) first."""
    m = Measurement(summary=dict(metrics))
    out = []
    for slo in slos:
        v = m.value(slo.metric)
        ex = violation(slo, v)
        if ex > 0:
            limit = slo.max if slo.max is not None else slo.min
            assert limit is not None
            out.append(SloMiss(slo.metric, v, float(limit), "max" if slo.max is not None else "min", ex))
    return sorted(out, key=lambda x: -x.excess)


def nearest_misses(trials: Iterable[Any], spec: AgentSpec, k: int = 3) -> list[NearMiss]:
    """The `k` measured, infeasible trials closest to feasible (smallest worst relative SLO excess)."""
    found = []
    for t in trials:
        if t.state.name != "COMPLETE" or t.user_attrs.get("feasible") or t.user_attrs.get("cause"):
            continue
        misses = slo_misses(t.user_attrs.get("metrics") or {}, spec.slos)
        if misses:
            found.append(NearMiss(t.number, bool(t.user_attrs.get("baseline")), tuple(misses)))
    return sorted(found, key=lambda n: (n.worst, n.trial))[:k]


def failure_causes(trials: Iterable[Any]) -> Counter[str]:
    """Trials that produced no measurement, by cause (deploy_failed, startup_timeout, interrupted, ...)."""
    return Counter(str(t.user_attrs.get("cause")) for t in trials if t.user_attrs.get("cause"))


def advice(spec: AgentSpec, misses: Sequence[NearMiss]) -> str:
    """What to change when no trial is feasible."""
    if not misses:
        return "no trial was measured: see the causes above and the server logs under the state dir's logs/"
    a = spec.workload.arrival
    latency = any(m.metric.split(".")[0] in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")
                  for n in misses for m in n.misses)
    if latency and a.rate_per_s == "auto":
        return ("every configuration broke an SLO at the sized rate: lower workload.arrival.load, loosen the "
                "SLOs, or widen the search space")
    if latency and a.kind in ("constant", "poisson", "gamma"):
        return ("every configuration broke an SLO at this rate: set workload.arrival.rate_per_s: auto (sized on "
                "this host), lower the rate, loosen the SLOs, or widen the search space")
    if latency and a.kind == "closed":
        return ("every configuration broke an SLO: lower workload.arrival.concurrency, loosen the SLOs, or widen "
                "the search space")
    return "every configuration broke an SLO: loosen the SLOs or widen the search space"


def cost_lines(outcomes: Sequence[Any]) -> list[str]:
    """What the cycle's trials were spared and what they spent beyond one run: the pruned trials (stopped early,
    their partial measurement kept) and, with a `max_rate_under_slo` objective, the capacity searches' cost."""
    lines = []
    pruned = [o for o in outcomes if getattr(o, "pruned", None)]
    if pruned:
        shown = "; ".join(f"trial {o.number} after {o.duration_s:.0f} s: {o.pruned}" for o in pruned[:5])
        lines.append(f"pruned {len(pruned)} trial(s), an SLO broken by far before the end (partial measurement "
                     f"kept): {shown}" + (" ..." if len(pruned) > 5 else ""))
    cost = [o.capacity for o in outcomes if getattr(o, "capacity", None)]
    if cost:
        runs = sum(int(c.get("runs") or 0) for c in cost)
        load = sum(float(c.get("load_s") or 0.0) for c in cost)
        wall = sum(float(c.get("wall_s") or 0.0) for c in cost)
        n = len(cost)
        lines.append(f"capacity search (max_rate_under_slo): {runs} probe run(s) over {n} trial(s), per trial "
                     f"{runs / n:.1f} run(s), {load / n:.0f} s of load, {wall / n:.0f} s wall; "
                     f"{sum(1 for c in cost if c.get('converged'))} converged")
    return lines


def run_summary(trials: Sequence[Any], spec: AgentSpec, *, feasible: bool, cycle_outcomes: Sequence[Any] = ()
                ) -> list[str]:
    """The lines printed under the final table: failure causes of this cycle, and when no trial of the study
    is feasible, its nearest misses and what to change."""
    lines = []
    causes = Counter(str(o.cause) for o in cycle_outcomes if getattr(o, "cause", None))
    if causes:
        lines.append("failed trials by cause: " + ", ".join(f"{c} x{n}" for c, n in causes.most_common()))
    lines += cost_lines(cycle_outcomes)
    if not feasible:
        misses = nearest_misses(trials, spec)
        if misses:
            lines.append("no feasible trial; nearest misses:")
            lines += [f"  {m.text()}" for m in misses]
        else:
            study_causes = failure_causes(trials)
            if study_causes and not causes:
                lines.append("failed trials by cause: " + ", ".join(f"{c} x{n}" for c, n in
                                                                  study_causes.most_common()))
        lines.append(f"what to change: {advice(spec, misses)}")
    return lines
