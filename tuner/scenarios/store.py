"""An agent's scenarios on disk: the proposed ones, the workload each scenario's study tunes on, which scenario's
champion is in service, and the switch journal. Under <state>/<agent>/scenarios/:

    proposed.json          scenarios the daemon proposed from observed traffic (a list of ScenarioSpec)
    service.json           the scenario whose champion is in service, since when, its champion's seq
    switches.jsonl         one line per switch, tune request, proposal (time, scenario, reason, observation)
    matrix.json            the last cross-evaluation (tuner.scenarios.matrix)
    <name>/                the scenario's champion store (tuner.champions.store), its lineage
                           (daemon_study.json) and fitted.json: the workload its study tunes on and the
                           observation it was fitted from
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tuner.base.files import atomic_write
from tuner.champions.store import ChampionStore, append_jsonl, read_jsonl, scenario_dir
from tuner.spec import AgentSpec, ScenarioSpec


class ScenarioBook:
    """One agent's scenarios and their state (see the module docstring)."""

    def __init__(self, state_dir: Path | str, agent: str) -> None:
        self.state_dir = Path(state_dir)
        self.agent = agent
        self.dir = self.state_dir / agent / "scenarios"

    # ------------------------------------------------------------ which scenarios
    def proposed(self) -> list[ScenarioSpec]:
        p = self.dir / "proposed.json"
        if not p.is_file():
            return []
        return [ScenarioSpec.model_validate(x) for x in json.loads(p.read_text())]

    def add_proposed(self, scn: ScenarioSpec) -> None:
        known = [s for s in self.proposed() if s.name != scn.name] + [scn]
        self.dir.mkdir(parents=True, exist_ok=True)
        atomic_write(self.dir / "proposed.json", json.dumps([s.model_dump(mode="json") for s in known], indent=1))

    def all(self, spec: AgentSpec) -> list[ScenarioSpec]:
        """The declared scenarios, then the proposed ones (a proposed name a declared one took is left out)."""
        declared = {s.name for s in spec.scenarios}
        return list(spec.scenarios) + [s for s in self.proposed() if s.name not in declared]

    def next_proposed_name(self, spec: AgentSpec) -> str:
        names = {s.name for s in self.all(spec)}
        n = 1
        while f"observed-{n}" in names:
            n += 1
        return f"observed-{n}"

    # ------------------------------------------------------------ per scenario
    def scenario_dir(self, name: str) -> Path:
        return scenario_dir(self.state_dir, self.agent, name)

    def champions(self, name: str) -> ChampionStore:
        return ChampionStore(self.state_dir, self.agent, name)

    def has_champion(self, name: str) -> bool:
        return (self.scenario_dir(name) / "champion.yaml").is_file()

    def lineage_path(self, name: str) -> Path:
        return self.scenario_dir(name) / "daemon_study.json"

    def study_key(self, name: str) -> str:
        """The name of the scenario's first study (later ones add the fingerprint: tuner.study.lineage)."""
        return f"{self.agent}.{name}"

    def _fitted_path(self, name: str | None) -> Path:
        return (self.scenario_dir(name) if name is not None else self.state_dir / self.agent) / "fitted.json"

    def fitted(self, name: str | None) -> dict[str, Any] | None:
        """{"workload": the WorkloadSpec as JSON, "observation": what it was fitted from, "fitted_at": time} of a
        scenario's study (None: the agent's own study)."""
        p = self._fitted_path(name)
        return json.loads(p.read_text()) if p.is_file() else None

    def set_fitted(self, name: str | None, workload: dict[str, Any], observation: dict[str, Any] | None) -> None:
        p = self._fitted_path(name)
        p.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(p, json.dumps({"workload": workload, "observation": observation, "fitted_at": time.time()},
                                   indent=1, default=str))

    def current_study(self, name: str) -> str | None:
        """The study a scenario's lineage names (None: the scenario has none yet)."""
        try:
            return str(json.loads(self.lineage_path(name).read_text())["study"])
        except (OSError, ValueError, KeyError):
            return None

    # ------------------------------------------------------------ service and journal
    def service(self) -> dict[str, Any] | None:
        p = self.dir / "service.json"
        return json.loads(p.read_text()) if p.is_file() else None

    def set_service(self, scenario: str, seq: int | None, at: float) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        atomic_write(self.dir / "service.json", json.dumps({"scenario": scenario, "seq": seq, "since": at}))

    def journal(self, entry: dict[str, Any]) -> None:
        append_jsonl(self.dir / "switches.jsonl", {"time": time.time(), "agent": self.agent, **entry})

    def switches(self) -> list[dict[str, Any]]:
        return read_jsonl(self.dir / "switches.jsonl")

    def matrix(self) -> dict[str, Any] | None:
        p = self.dir / "matrix.json"
        return json.loads(p.read_text()) if p.is_file() else None

    def set_matrix(self, data: dict[str, Any]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        atomic_write(self.dir / "matrix.json", json.dumps(data, indent=1, default=str))
