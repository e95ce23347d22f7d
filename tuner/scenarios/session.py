"""Opening the study a cycle tunes: for the traffic observed (tuner.observe's ObservedWorkload) and the scenario
it falls in.

How observed workloads map to studies: each scenario has its own lineage (tuner.study.lineage, the file
<state>/<agent>/scenarios/<name>/daemon_study.json) and its study tunes one fitted workload, so that its
trials stay comparable. The first observation of a scenario fits that workload (recorded in fitted.json); later
cycles keep it while the observed traffic stays within `switching.refit_threshold` of it (any statistic,
relative), so small changes open no study. A larger change refits: the fingerprint changes and the lineage
opens a new study warm-started with the former one's best configurations. A scenario's first study is
warm-started from the nearest scenario's study. Without declared scenarios the agent's own study follows the
same rule on the agent's lineage. Before any traffic was observed a scenario tunes its declared `workload`, else
the agent's.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from tuner.context import AgentContext
from tuner.loop import Session, open_session
from tuner.scenarios.regions import classify, nearest, point_of, relative_change
from tuner.scenarios.store import ScenarioBook
from tuner.spec import ScenarioSpec, WorkloadSpec
from tuner.study.lineage import current_study_name, fingerprint, plan_study, warm_start
from tuner.study.study import study_exists

log = logging.getLogger(__name__)


class Observation(Protocol):
    """What tuner.observe's ObservedWorkload gives: the fitted workload, its window, source, statistics and
    the error of the fit."""

    workload: WorkloadSpec
    start_s: float
    end_s: float
    source: str
    stats: dict[str, float]
    fit_error: Any


def observation_record(obs: Observation | None) -> dict[str, Any] | None:
    """An observation as JSON (window, source, statistics, fit error and the workload)."""
    if obs is None:
        return None
    fe = obs.fit_error
    if dataclasses.is_dataclass(fe) and not isinstance(fe, type):
        fe = dataclasses.asdict(fe)
    elif hasattr(fe, "model_dump"):
        fe = fe.model_dump(mode="json")
    return {"start_s": float(obs.start_s), "end_s": float(obs.end_s), "window_s": float(obs.end_s - obs.start_s),
            "source": str(obs.source), "stats": {k: float(v) for k, v in obs.stats.items()}, "fit_error": fe,
            "workload": obs.workload.model_dump(mode="json")}


@dataclasses.dataclass
class Planned:
    """What a cycle tunes: the session (its study), the scenario (None: the agent's own study), the workload,
    where the workload came from, the observation and the warm start."""

    session: Session
    scenario: str | None
    workload_source: str  # observed (fitted now) | fitted (kept: within the refit threshold) | declared | agent
    observation: dict[str, Any] | None
    warm_started: list[int]
    warm_from: str | None
    refit_change: float | None  # the observed traffic's relative change from the study's fitted workload


def scenario_of(ctx: AgentContext, obs: Observation | None) -> str | None:
    """The scenario the observed traffic falls in (None: no scenarios, no observation, or outside all)."""
    scenarios = ScenarioBook(ctx.state_dir, ctx.name).all(ctx.agent.spec)
    if obs is None or not scenarios:
        return None
    return classify(scenarios, point_of(obs.stats))


def plan_cycle(ctx: AgentContext, obs: Observation | None, scenario: str | None = None) -> Planned:
    """Open the session a cycle tunes (see the module docstring). `scenario`: the one to tune (default: where the
    observation falls; None when there is none)."""
    spec = ctx.agent.spec
    book = ScenarioBook(ctx.state_dir, ctx.name)
    scenarios = book.all(spec)
    if scenario is None:
        scenario = scenario_of(ctx, obs)
    scn = next((s for s in scenarios if s.name == scenario), None)
    if scenario is not None and scn is None:
        raise ValueError(f"{ctx.name} has no scenario {scenario!r} (known: {[s.name for s in scenarios]})")
    workload, source, record, change = _workload_for(book, scn, spec.workload, obs,
                                                     spec.switching.refit_threshold)
    agent = ctx.agent.model_copy(update={"spec": spec.model_copy(update={"workload": workload})})
    if scn is None:  # the agent's own study and lineage, on the workload chosen
        actx = dataclasses.replace(ctx, agent=agent)
        session = actx.session(plan=True)
        ctx.study_name = actx.study_name
        return Planned(session, None, source, record, actx.warm_started, None, change)
    target = ctx.target()
    fp = fingerprint(target.describe(), {"scenario": scn.model_dump(mode="json", exclude={"description"}),
                                         "workload": workload.model_dump(mode="json")})
    first = not book.lineage_path(scn.name).is_file()
    name, old = plan_study(book.study_key(scn.name), fp, ctx.state_dir, path=book.lineage_path(scn.name))
    session = open_session(agent, ctx.state_dir, target=target, study_name=name, tracker=ctx.tracker())
    session.scenario = scn.name
    warm_from = old
    if first and old is None:
        warm_from = _nearest_study(ctx, book, scenarios, scn)
    warmed = warm_start(session, warm_from) if warm_from else []
    if warmed:
        log.info("%s: scenario %s's study %s warm-started from %s (trials %s)", ctx.name, scn.name, name,
                 warm_from, warmed)
    return Planned(session, scn.name, source, record, warmed, warm_from, change)


def _workload_for(book: ScenarioBook, scn: ScenarioSpec | None, agent_workload: WorkloadSpec,
                  obs: Observation | None, threshold: float
                  ) -> tuple[WorkloadSpec, str, dict[str, Any] | None, float | None]:
    key = scn.name if scn is not None else None
    fitted = book.fitted(key)
    record = observation_record(obs)
    if obs is not None and record is not None:
        change = None
        if fitted is not None and isinstance(fitted.get("observation"), Mapping):
            change = relative_change(point_of(fitted["observation"].get("stats", {})), point_of(obs.stats))
        if fitted is None or change is None or change > threshold:
            wl = tuning_workload(agent_workload, obs.workload)
            book.set_fitted(key, wl.model_dump(mode="json"), record)
            return wl, "observed", record, change
        return WorkloadSpec.model_validate(fitted["workload"]), "fitted", record, change
    if fitted is not None:
        return WorkloadSpec.model_validate(fitted["workload"]), "fitted", None, None
    if scn is not None and scn.workload is not None:
        return scn.workload, "declared", None, None
    return agent_workload, "agent", None, None


def tuning_workload(agent_workload: WorkloadSpec, observed: WorkloadSpec) -> WorkloadSpec:
    """What a trial runs for observed traffic: the traffic's shape from the observation (arrival, prompt and
    output lengths) and the measurement protocol from the agent (how many requests or seconds a trial lasts,
    warm-up, endpoint, streaming, timeouts, seed)."""
    return agent_workload.model_copy(update={"arrival": observed.arrival, "prompt_tokens": observed.prompt_tokens,
                                             "output_tokens": observed.output_tokens, "tasks": observed.tasks,
                                             "dataset": observed.dataset})


def _nearest_study(ctx: AgentContext, book: ScenarioBook, scenarios: list[ScenarioSpec],
                   scn: ScenarioSpec) -> str | None:
    """The study of the nearest scenario that has one (else the agent's own study, when it exists)."""
    others = [s for s in scenarios if s.name != scn.name]
    while others:
        near = nearest([scn, *others], scn)
        if near is None:
            break
        name = book.current_study(near.name)
        if name is not None and study_exists(ctx.storage_url, name):
            return name
        others = [s for s in others if s.name != near.name]
    own = current_study_name(ctx.state_dir, ctx.name)
    return own if study_exists(ctx.storage_url, own) else None
