"""A switch: put a scenario's verified champion in service through the Act path (tuner.promotion.act).

The agent's own champion store holds the configuration in service: a switch promotes the scenario champion's
configuration there, with the scenario champion's verification as evidence (so the audit log, the champion
history, rollback, the MLflow alias `champion` and the agent's apply command all work as for a promotion).
The scenario's own champion keeps its alias `scenario-<name>`. What was done and why is one log line, an entry in
the scenario journal (switches.jsonl, shown by `tuner history`) and an MLflow run tagged kind=switch.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

from tuner.champions.db import champion_store, champion_store_for
from tuner.errors import PromotionError
from tuner.promotion.act import promote_config
from tuner.scenarios.store import ScenarioBook

if TYPE_CHECKING:
    from pathlib import Path

    from tuner.agent import Agent
    from tuner.loop import Session
    from tuner.tracking.tracker import Tracker

log = logging.getLogger(__name__)


def put_in_service(agent: Agent, state_dir: Path, scenario: str, *, reason: str, tracker: Tracker | None,
                   previous: str | None = None, observation: dict[str, Any] | None = None) -> dict[str, Any]:
    """Make `scenario`'s champion the configuration in service. Returns the journal entry. Raises
    PromotionError when the scenario has no champion or the apply command fails (the former one stays)."""
    book = ScenarioBook(state_dir, agent.name)
    champ = book.champions(scenario).champion()
    if champ is None:
        raise PromotionError(f"scenario {scenario} of {agent.name} has no champion to put in service")
    if not champ.verified:
        log.warning("scenario %s's champion #%s was promoted without verification", scenario, champ.seq)
    store = champion_store_for(agent, state_dir)
    why = f"switch to scenario {scenario}: {reason}"
    with store.lock():
        cur = store.champion()
        if cur is not None and cur.config == champ.config:
            seq, action = cur.seq, "kept"  # the same configuration serves both: nothing to apply
            store.audit({"action": "switch_kept", "seq": seq, "scenario": scenario, "reason": why,
                         "evidence": champ.evidence})
        else:
            res = promote_config(store, tracker, config=champ.config, apply_command=agent.spec.promotion.apply_command,
                                 cwd=agent.path.parent, study=champ.study, trial=champ.trial, values=champ.values,
                                 evidence=champ.evidence, verified=champ.verified, reason=why, _locked=True)
            seq, action = res.record.seq, "switched"
    book.set_service(scenario, seq, time.time())
    run_id = None
    if tracker is not None and tracker.enabled:
        run_id = tracker.start_run(f"switch-{scenario}", tags={
            "kind": "switch", "agent": agent.name, "scenario": scenario, "previous_scenario": previous or "",
            "action": action, "champion_seq": seq, "scenario_champion_seq": champ.seq, "reason": why[:4000]})
        if observation is not None:
            tracker.log_text(run_id, json.dumps(observation, indent=1, default=str), "observation.json")
        tracker.end_run(run_id)
    log.warning("%s: switch to scenario %s (champion #%s, trial %s of %s)%s: %s", agent.name, scenario, seq,
                champ.trial, champ.study, ", its configuration already in service: nothing applied"
                if action == "kept" else "", reason)
    entry = {"kind": "switch", "action": action, "scenario": scenario, "previous": previous, "seq": seq,
             "scenario_seq": champ.seq, "study": champ.study, "trial": champ.trial, "reason": why,
             "config": champ.config, "observation": observation, "run_id": run_id}
    book.journal(entry)  # last: what reads the journal finds the service, MLflow and the log line done
    return entry


def record_decision(agent: Agent, state_dir: Path, kind: str, scenario: str | None, *, reason: str,
                    tracker: Tracker | None, observation: dict[str, Any] | None = None) -> None:
    """A tune request, a proposal or traffic outside every scenario: journal, MLflow and one log line."""
    ScenarioBook(state_dir, agent.name).journal({"kind": kind, "scenario": scenario, "reason": reason,
                                                 "observation": observation})
    if tracker is not None and tracker.enabled:
        tracker.end_run(tracker.start_run(f"{kind}-{scenario or 'traffic'}", tags={
            "kind": f"scenario_{kind}", "agent": agent.name, "scenario": scenario or "", "reason": reason[:4000]}))
    log.warning("%s: %s%s: %s", agent.name, kind, f" scenario {scenario}" if scenario else "", reason)


def adopt_baseline(session: Session) -> dict[str, Any] | None:
    """A scenario whose cycle found no verified improvement keeps the baseline (the defaults: the reference arm
    of every verification) as its champion, so that it can be put in service; a later verified candidate
    replaces it. None when the scenario has a champion already or its baseline was not measured feasible."""
    store = champion_store(session)
    if session.scenario is None or store.champion() is not None:
        return None
    base = session.study.baseline()
    if base is None or not base.values or not base.user_attrs.get("feasible"):
        return None
    feasible = sum(1 for t in session.study.trials() if t.state.name == "COMPLETE" and t.user_attrs.get("feasible"))
    space = session.agent.space
    res = promote_config(store, session.tracker, config=space.full_config(space.defaults()), apply_command=None,
                         cwd=session.agent.path.parent, study=session.study.name, trial=base.number,
                         values=list(base.values), verified=True,
                         reason=f"baseline kept for scenario {session.scenario}: no trial of {feasible} feasible "
                                "was verified better on its traffic")
    return {"action": "baseline", "seq": res.record.seq}
