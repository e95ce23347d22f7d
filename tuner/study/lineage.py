"""Study lineage: which Optuna study an agent continues, and warm starts across a changed target or workload.

An agent's study is named after the agent until its conditions change: a new target version (the target's
describe()) or a new workload gives a new fingerprint, and the agent moves on to `<name>-<fingerprint>`,
warm-started with the former study's best feasible configurations. `<state>/<agent>/daemon_study.json`
records the lineage; every command and the daemon read the study named there (tuner.context).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.base.files import atomic_write
from tuner.study.study import TunerStudy

if TYPE_CHECKING:
    from tuner.loop import Session

log = logging.getLogger(__name__)

WARM_START_TOP_K = 3


def lineage_path(state_dir: Path, agent_name: str) -> Path:
    return Path(state_dir) / agent_name / "daemon_study.json"


def fingerprint(describe: Mapping[str, Any], workload: Any) -> str:
    """8 hex digits over the target's description and the workload (JSON, keys sorted)."""
    blob = json.dumps({"target": dict(describe), "workload": workload}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:8]


def current_study_name(state_dir: Path, agent_name: str) -> str:
    """The study the agent continues (a suffixed one after a target/workload change); reads only."""
    p = lineage_path(state_dir, agent_name)
    if p.is_file():
        try:
            return str(json.loads(p.read_text())["study"])
        except (OSError, ValueError, KeyError):
            pass
    return agent_name


def plan_study(agent_name: str, fp: str, state_dir: Path, *, path: Path | None = None) -> tuple[str, str | None]:
    """The study this cycle continues given the conditions' fingerprint `fp`: (name, the former study's name
    when the conditions changed). Records the lineage (in `path`: a scenario's own lineage file; default the
    agent's)."""
    path = path or lineage_path(state_dir, agent_name)
    known = json.loads(path.read_text()) if path.is_file() else None
    if known is None:
        atomic_write(path, json.dumps({"fingerprint": fp, "study": agent_name, "history": []}))
        return agent_name, None
    if known.get("fingerprint") == fp:
        return str(known["study"]), None
    new = f"{agent_name}-{fp}"
    old = str(known["study"])
    hist = list(known.get("history", [])) + [{"study": old, "fingerprint": known.get("fingerprint"),
                                               "until": time.time()}]
    atomic_write(path, json.dumps({"fingerprint": fp, "study": new, "history": hist}))
    log.warning("%s: target or workload changed (fingerprint %s -> %s): new study %s warm-started from %s",
                agent_name, known.get("fingerprint"), fp, new, old)
    return new, old


def warm_start(session: Session, old_study: str, k: int = WARM_START_TOP_K) -> list[int]:
    """Enqueue the old study's k best feasible configurations into the (new, empty) session study."""
    mine = session.study.trials()
    if any(t.user_attrs.get("warm_start_from") or t.state.name == "COMPLETE" for t in mine):
        return []  # warm-started (or already running) before
    old = TunerStudy(session.agent.spec, session.agent.space, storage_url=session.study.storage_url,
                     study_name=old_study)
    sign = 1 if session.agent.spec.objectives[0].direction == "maximize" else -1
    feasible = [t for t in old.trials() if t.state.name == "COMPLETE" and t.user_attrs.get("feasible") and t.values]
    feasible.sort(key=lambda t: -sign * t.values[0])
    names = {p.name for p in session.agent.space.params}
    enq: list[int] = []
    seen: list[dict[str, Any]] = []
    for t in feasible:
        params = {kk: v for kk, v in t.params.items() if kk in names}
        if params in seen:
            continue  # the same configuration measured twice: one warm start
        if len(enq) >= k:
            break
        seen.append(params)
        session.study.study.enqueue_trial(params, user_attrs={"warm_start_from": f"{old_study}#{t.number}"},
                                          skip_if_exists=True)
        enq.append(t.number)
    return enq
