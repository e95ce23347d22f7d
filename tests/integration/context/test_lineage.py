"""One context opener: after the workload changes under the daemon, `status`, `history`, `promote`, `rollback`,
`run` and the daemon's next cycle all read the study the lineage names (`<agent>-<fingerprint>`)."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
from typer.testing import CliRunner

from tests.support import agents
from tuner.champions.store import ChampionStore
from tuner.cli.main import app
from tuner.daemon.cycle import run_agent_cycle
from tuner.study.study import default_storage


def write_agent(d: Path, concurrency: int, tracking: bool = False) -> Path:
    return agents.write_agent(d / "lin.yaml", name="lin", tracking={"enabled": tracking},
                              at={"workload.arrival.concurrency": concurrency, "workload.num_requests": 40})


def cli(*args: str) -> str:
    r = CliRunner().invoke(app, list(args))
    assert r.exit_code == 0, r.output
    return r.output


def budget_trials(status: dict) -> int:
    """Finished budget trials: a re-proposed configuration measured as a repeat (REPEATS) is no budget trial."""
    return int(status["trials"]["COMPLETE"] - status["trials"].get("REPEATS", 0))


def test_every_command_reads_the_study_the_daemon_moved_to(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    agent = write_agent(tmp_path, 64, tracking=True)  # history reads the cycles from MLflow
    first = run_agent_cycle(agent, sd, trials=2)  # the daemon's cycle
    assert first["study"] == "lin"
    write_agent(tmp_path, 16, tracking=True)  # the workload changes under the daemon
    moved = run_agent_cycle(agent, sd, trials=3)
    new = moved["study"]
    assert new.startswith("lin-") and new != "lin"

    status = json.loads(cli("status", str(agent), "--state-dir", str(sd), "--json"))
    assert status["study"] == new and budget_trials(status) == 3
    history = json.loads(cli("history", str(agent), "--state-dir", str(sd), "--json"))
    assert [c["study"] for c in history["cycles"]] == ["lin", new]

    # promote takes the best trial of the new study: the champion records that study
    cli("promote", str(agent), "--skip-verify", "--yes", "--state-dir", str(sd))
    assert ChampionStore(sd, "lin").champion().study == new
    best = json.loads(cli("status", "--state-dir", str(sd), "--json"))  # the agent argument is optional
    assert best["champion"]["study"] == new
    champ = ChampionStore(sd, "lin").champion().config
    other = next(t.number for t in optuna.load_study(study_name=new, storage=default_storage(sd)).trials
                 if t.params and {**champ, **t.params} != champ)
    cli("promote", str(agent), "--skip-verify", "--yes", "--state-dir", str(sd), "--trial", str(other))
    cli("rollback", "--yes", "--state-dir", str(sd))  # the state dir's one agent
    assert ChampionStore(sd, "lin").champion().study == new and ChampionStore(sd, "lin").champion().config == champ

    # `tuner run` continues the same study, and so does the daemon's next cycle
    cli("run", str(agent), "--trials", "1", "--state-dir", str(sd))
    assert budget_trials(json.loads(cli("status", str(agent), "--state-dir", str(sd), "--json"))) == 4
    assert run_agent_cycle(agent, sd, trials=1)["study"] == new


def test_read_only_commands_create_nothing(tmp_path: Path) -> None:
    agent = write_agent(tmp_path, 64)
    sd = tmp_path / "state"
    status = json.loads(cli("status", str(agent), "--state-dir", str(sd), "--json"))
    assert status["study"] == "lin" and status["trials"]["COMPLETE"] == 0 and status["champion"] is None
    history = json.loads(cli("history", str(agent), "--state-dir", str(sd), "--json"))
    assert history == {"cycles": [], "verifications": [], "promotions": [], "events": [], "switches": []}
    r = CliRunner().invoke(app, ["check", "--state-dir", str(sd)])
    assert r.exit_code == 1 and "no heartbeat" in r.output
    cli("validate", str(agent))
    assert not sd.exists()


def test_without_an_agent_argument_the_state_dirs_one_agent_is_used_or_the_choice_named(tmp_path: Path) -> None:
    sd = tmp_path / "state"
    r = CliRunner().invoke(app, ["status", "--state-dir", str(sd)])
    assert r.exit_code == 2 and "holds no agent yet" in r.output
    a = write_agent(tmp_path, 64)
    cli("run", str(a), "--trials", "1", "--state-dir", str(sd))
    assert json.loads(cli("status", "--state-dir", str(sd), "--json"))["agent"] == "lin"
    b = agents.write_agent(tmp_path / "other.yaml", name="other", tracking={"enabled": False},
                           at={"workload.num_requests": 20})
    cli("run", str(b), "--trials", "1", "--state-dir", str(sd))
    r = CliRunner().invoke(app, ["status", "--state-dir", str(sd)])
    assert r.exit_code == 2 and "holds 2 agents" in " ".join(r.output.split()), r.output
