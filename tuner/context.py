"""The one way every command and the daemon open an agent: state dir, the agent's file, the study it continues
(its lineage), the Optuna storage, the MLflow tracker, the target and logging.

`open_context(agent_path, state_dir, create=...)` loads the agent (or, with no path, the one agent the state
dir holds) and names the study from the lineage (tuner.study.lineage), so `run`, `status`, `promote`, `history`,
`rollback` and the daemon always agree on the study. `create=False` (read-only commands) creates nothing: no
state dir, no database, no study; `AgentContext.read_study()` is then None until a run made one.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from tuner.agent import Agent, load_agent
from tuner.base.files import atomic_write, private_dir
from tuner.champions.store import ChampionStore
from tuner.errors import ConfigError
from tuner.loop import Session, open_session, recover_champion
from tuner.study.lineage import current_study_name, fingerprint, plan_study, warm_start
from tuner.study.study import TunerStudy, default_storage, study_exists
from tuner.targets.base import Target
from tuner.targets.registry import make_target
from tuner.tracking.tracker import Tracker

log = logging.getLogger(__name__)

AGENT_RECORD = "agent.json"  # <state>/<agent>/agent.json: where the agent's file is (the CLI's default agent)


def state_dir_for(state_dir: Path | None, *, create: bool = True) -> Path:
    """The state dir: the one given, else $TUNER_STATE_DIR, else .tuner/ (made private only with `create`)."""
    d = Path(state_dir or os.environ.get("TUNER_STATE_DIR") or ".tuner")
    return private_dir(d) if create else d


def recorded_agents(state_dir: Path) -> dict[str, Path]:
    """The agents whose files a run or the daemon recorded in the state dir: name -> file."""
    out: dict[str, Path] = {}
    if not state_dir.is_dir():
        return out
    for rec in sorted(state_dir.glob(f"*/{AGENT_RECORD}")):
        try:
            out[rec.parent.name] = Path(json.loads(rec.read_text())["path"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def agent_path_for(agent_path: Path | None, state_dir: Path) -> Path:
    """The agent file given, or the one agent the state dir holds (a ConfigError when none or several)."""
    if agent_path is not None:
        return agent_path
    known = recorded_agents(state_dir)
    if len(known) == 1:
        return next(iter(known.values()))
    if not known:
        raise ConfigError(f"give the agent file: the state dir {state_dir} holds no agent yet "
                          "(`tuner run AGENT.yaml` records one)")
    listing = ", ".join(f"{n} ({p})" for n, p in known.items())
    raise ConfigError(f"give the agent file: the state dir {state_dir} holds {len(known)} agents: {listing}")


@dataclass
class AgentContext:
    """An opened agent: what every command needs, built one way."""

    agent: Agent
    state_dir: Path
    study_name: str
    create: bool
    warm_started: list[int] = field(default_factory=list)
    _target: Target | None = None

    @property
    def name(self) -> str:
        return self.agent.name

    @property
    def storage_url(self) -> str:
        return self.agent.spec.storage or default_storage(self.state_dir)

    def tracker(self) -> Tracker:
        return Tracker.for_agent(self.agent.spec, self.state_dir)

    def target(self) -> Target:
        if self._target is None:
            self._target = make_target(self.agent.spec.target.kind, self.agent.target_options,
                                       self.agent.path.parent)
        return self._target

    def session(self, *, plan: bool = False, target: Target | None = None) -> Session:
        """Open the study for writing (stores are created; stale trials and orphan servers reaped).

        `plan`: first follow the lineage: a changed target version or workload moves the agent on to a new
        study, warm-started with the former one's best configurations (`warm_started` lists them)."""
        if not self.create:
            raise RuntimeError("a read-only context opens no session")
        if target is not None:
            self._target = target
        tgt = self.target()
        old = None
        if plan:
            fp = fingerprint(tgt.describe(), self.agent.spec.workload.model_dump(mode="json"))
            self.study_name, old = plan_study(self.name, fp, self.state_dir)
        s = open_session(self.agent, self.state_dir, target=tgt, study_name=self.study_name,
                         tracker=self.tracker())
        if old:
            self.warm_started = warm_start(s, old)
        return s

    def has_state(self) -> bool:
        """Whether anything of this agent is in the state dir yet (read-only commands look only then)."""
        return (self.state_dir / self.name).is_dir()

    def read_tracker(self) -> Tracker | None:
        """The tracker for reading, or None when its SQLite store is not there (nothing is created)."""
        tr = self.tracker()
        if tr.uri.startswith("sqlite:") and not Path(tr.uri.split(":///", 1)[-1]).is_file():
            return None
        return tr

    def recover_champion(self) -> None:
        """A promote or rollback killed half-way is undone or completed before the command goes on, and MLflow's
        aliases follow (tuner.loop.recover_champion). Here only for a champion store in files, and only when
        its journal is there; a store in the fleet's database is recovered when a session opens."""
        if not self.storage_url.startswith("sqlite") or not self.has_state():
            return
        store = ChampionStore(self.state_dir, self.name)
        if store.in_flight():
            recover_champion(store, self.tracker() if self.create else self.read_tracker())

    def read_study(self) -> TunerStudy | None:
        """The agent's study for reading, or None when there is none yet (nothing is created)."""
        if not study_exists(self.storage_url, self.study_name):
            return None
        return TunerStudy(self.agent.spec, self.agent.space, storage_url=self.storage_url,
                          study_name=self.study_name)


def open_context(agent_path: Path | str | None, state_dir: Path | None = None, *,
                 create: bool = True) -> AgentContext:
    """Load the agent (the path given, or the state dir's only agent) and name the study its lineage says.

    `create`: make the state dir and record where the agent's file is (commands that run or change things);
    read-only commands pass False and create nothing."""
    sd = state_dir_for(state_dir, create=create)
    path = agent_path_for(Path(agent_path) if agent_path is not None else None, sd)
    agent = load_agent(path)
    if create:
        record = sd / agent.name / AGENT_RECORD
        want = str(agent.path.resolve())
        try:
            known = json.loads(record.read_text()).get("path") if record.is_file() else None
        except (OSError, ValueError, AttributeError):
            known = None
        if known != want:
            atomic_write(record, json.dumps({"path": want}))
    ctx = AgentContext(agent=agent, state_dir=sd, study_name=current_study_name(sd, agent.name), create=create)
    ctx.recover_champion()
    return ctx
