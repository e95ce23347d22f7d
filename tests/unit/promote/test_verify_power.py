"""Verification power on the simulator with 5% run-to-run noise (seeded, so the counts are exact).

A candidate truly 15% better (noise-free objective measured, not assumed) must be promoted in >= 95% of
40 seeded verifications, and a truly equal one (the champion's own configuration) in <= 5%.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.agents import write_agent
from tuner.agent import load_agent
from tuner.champions.store import ChampionStore
from tuner.loop import measure_config, open_session
from tuner.promotion.act import promote_config
from tuner.promotion.verify import verify
from tuner.targets.base import TrialContext

CHAMPION = {"max_num_seqs": 24}
VERIFICATIONS = 40


def _session(tmp_path: Path, cv: float, runs: int = 8):
    p = write_agent(tmp_path / f"power-{cv}.yaml", name="power", sampler=None, tracking={"enabled": False},
                    search_space={"params": {"max_num_seqs": {"type": "int", "low": 8, "high": 1024, "log": True,
                                                              "default": 256}}},
                    promotion={"verify_runs": runs, "min_improvement": 0.02, "confidence": 0.95},
                    at={"target.noise_cv": cv, "workload.num_requests": 200})
    sd = tmp_path / f"state-{cv}"
    sd.mkdir()
    return open_session(load_agent(p), sd)


def _throughput(session, config: dict) -> float:
    ctx = TrialContext(trial_number=0, state_dir=session.state_dir, seed=1, label="noise-free")
    m, _ = measure_config(session, config, ctx)
    return m.value("output_throughput")


@pytest.fixture(scope="module")
def better_config(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A configuration whose noise-free throughput is 15% (+-1%) above the champion's."""
    s = _session(tmp_path_factory.mktemp("noise-free"), 0.0)
    base = _throughput(s, CHAMPION)
    ratios = {n: _throughput(s, {"max_num_seqs": n}) / base for n in range(25, 65)}
    n = min(ratios, key=lambda k: abs(ratios[k] - 1.15))
    assert 1.14 <= ratios[n] <= 1.16, ratios
    assert _throughput(s, CHAMPION) == base  # noise-free really is noise-free
    return {"max_num_seqs": n}


def _promoted_share(tmp_path: Path, candidate: dict, runs: int = 8) -> float:
    s = _session(tmp_path, 0.05, runs)
    store = ChampionStore(s.state_dir, "power")
    promote_config(store, None, config=CHAMPION, apply_command=None, cwd=tmp_path)
    passed = 0
    factors = set()
    for k in range(VERIFICATIONS):
        v = verify(s, candidate, candidate_trial=k, store=store, seed=10_000 * (k + 1), record=False)
        assert len(v.runs) == 2 * runs and [r.arm for r in v.runs[:4]] == ["A", "B", "A", "B"]
        factors.update(round(r.metrics["sim_noise_factor"], 6) for r in v.runs)
        passed += v.passed
    assert len(factors) > VERIFICATIONS  # the noise really differs from run to run
    return passed / VERIFICATIONS


@pytest.mark.slow  # 40 verifications: not in `make test-fast`
def test_a_truly_15_percent_better_candidate_is_promoted(tmp_path: Path, better_config: dict) -> None:
    assert _promoted_share(tmp_path, better_config) >= 0.95


@pytest.mark.slow  # 40 verifications: not in `make test-fast`
def test_a_truly_equal_candidate_is_not_promoted(tmp_path: Path) -> None:
    assert _promoted_share(tmp_path, dict(CHAMPION)) <= 0.05
