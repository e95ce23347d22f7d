"""What a report shows, gathered from the Optuna study and the champion store (never from MLflow: the study
is the source of truth and a report must work with tracking off)."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from tuner.agent import Agent
from tuner.study.objectives import improvement


@dataclass
class TrialRow:
    number: int
    state: str  # feasible, infeasible, failed, interrupted, running, waiting
    baseline: bool
    values: list[float | None]
    metrics: dict[str, float]
    params: dict[str, Any]
    cause: str | None = None
    error: str | None = None
    broken: list[str] = field(default_factory=list)  # SLOs the measurement broke
    duration_s: float | None = None
    candidate: str | None = None  # the agent's candidate (a known profile) this trial tried


@dataclass
class ReportData:
    agent: str
    study: str
    generated_at: float
    target: dict[str, Any]
    target_description: dict[str, str]
    workload: dict[str, Any]
    objectives: list[dict[str, str]]
    slos: list[str]
    counts: dict[str, int]
    rows: list[TrialRow]
    baseline: TrialRow | None
    best: list[TrialRow]
    champion: dict[str, Any] | None
    champion_row: TrialRow | None
    failures: dict[str, int]
    verifications: list[dict[str, Any]]
    promotions: list[dict[str, Any]]
    key_metrics: list[str]
    plots: dict[str, bytes] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)  # the production monitor's (tuner.monitor)
    scenarios: list[dict[str, Any]] = field(default_factory=list)  # the scenario table (tuner.scenarios.table)
    scenario_confidence: float | None = None  # of the cross-evaluation's intervals

    def vs_baseline(self, row: TrialRow | None) -> str:
        """`+12.3%` on the first objective, or `-`."""
        base = self.baseline
        if row is None or base is None or row is base or not row.values or not base.values:
            return "-"
        a, b = row.values[0], base.values[0]
        if a is None or b is None:
            return "-"
        return f"{improvement(a, b, self.objectives[0]['direction']):+.1%}"


def _state(t: FrozenTrial) -> str:
    cause = t.user_attrs.get("cause")
    if t.state == TrialState.COMPLETE:
        if cause:
            return "failed"
        return "feasible" if t.user_attrs.get("feasible") else "infeasible"
    if t.state == TrialState.FAIL:
        return "interrupted" if cause == "interrupted" else "failed"
    return t.state.name.lower()


def _row(t: FrozenTrial) -> TrialRow:
    state = _state(t)
    measured = state in ("feasible", "infeasible", "pruned")  # a pruned trial: its partial measurement
    cons = dict(t.constraints or {})
    broken = [k.split(":", 1)[1] for k, v in cons.items() if k.startswith("slo:") and v > 0] \
        if state in ("infeasible", "pruned") else []
    return TrialRow(
        number=t.number, state=state, baseline=bool(t.user_attrs.get("baseline")),
        values=list(t.values) if measured and t.values else [],
        metrics=dict(t.user_attrs.get("metrics") or {}), params=dict(t.params),
        cause=t.user_attrs.get("cause"), error=t.user_attrs.get("error"), broken=broken,
        duration_s=t.user_attrs.get("duration_s"), candidate=t.user_attrs.get("candidate"))


def gather(agent: Agent, state_dir: Path, study: Any, *, plots: bool = True) -> ReportData:
    """`study` is a TunerStudy already opened on the agent's storage."""
    from tuner.monitor.records import read_events
    from tuner.promotion.audit import champion_summary, history
    from tuner.scenarios.store import ScenarioBook
    from tuner.scenarios.table import scenario_rows
    from tuner.tracking.review import key_metrics

    spec = agent.spec
    trials = study.trials()
    rows = [_row(t) for t in trials]
    by_number = {r.number: r for r in rows}
    base = study.baseline()
    best = study.best()
    champ = champion_summary(state_dir, agent.name)
    champ_row = None
    if champ is not None and champ.get("study") == study.name:
        champ_row = by_number.get(int(champ["trial"]))
    hist = history(state_dir, agent.name)
    sample = next((r.metrics for r in rows if r.metrics), {})
    data = ReportData(
        agent=agent.name, study=study.name, generated_at=time.time(),
        target=spec.target.model_dump(mode="json", exclude_none=True),
        target_description=dict(study.study.user_attrs.get("target") or {}),
        workload=spec.workload.model_dump(mode="json", exclude_none=True),
        objectives=[{"metric": o.metric, "direction": o.direction} for o in spec.objectives],
        slos=[s.key for s in spec.slos],
        counts=study.counts(),
        rows=rows,
        baseline=by_number.get(base.number) if base is not None else None,
        best=[by_number[t.number] for t in best],
        champion=champ, champion_row=champ_row,
        failures=dict(Counter(r.cause or "?" for r in rows if r.state in ("failed", "interrupted"))
                      .most_common()),
        verifications=list(hist["verifications"]),
        promotions=list(hist["promotions"]),
        key_metrics=list(key_metrics(spec, sample)),
        events=read_events(state_dir, agent.name),
        scenarios=scenario_rows(agent, state_dir),
        scenario_confidence=(ScenarioBook(state_dir, agent.name).matrix() or {}).get("confidence"),
    )
    if plots:
        from tuner.tracking.plots import study_plots

        data.plots = study_plots(trials, spec)
    return data
