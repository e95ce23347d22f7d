"""Check: verify a candidate against the champion.

Verification deploys the champion (arm A) and the candidate (arm B) alternately, A B A B ..., on the
agent's workload with a different seed per run, so that slow drift of the machine hits both arms. A
one-sided paired test on the per-pair log-ratios of the primary objective must show that the candidate
is better by at least `promotion.min_improvement` with `promotion.confidence`; every SLO must hold in
every candidate run, its error rate must stay under `max_error_rate`, and where the target has a quality
probe its greedy tokens must agree with the reference arm's (the champion, else the baseline) at least
`min_quality`. Without a champion the baseline configuration stands in as arm A.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import yaml

from tuner.champions.db import champion_store
from tuner.champions.store import ChampionRecord, ChampionStore
from tuner.errors import Interrupted, TrialError
from tuner.promotion.stats import PairedTest, paired_test, token_agreement
from tuner.study.objectives import evaluate
from tuner.tracking.tracker import VERIFICATION_KEY_TAG, redact

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

    from tuner.loop import Session

log = logging.getLogger(__name__)


VERIFY_SEED_BASE = 100_000


# ---------------------------------------------------------------- verification
@dataclass
class ArmRun:
    arm: str  # "A" (champion or baseline) or "B" (candidate)
    pair: int
    seed: int
    label: str
    value: float | None = None  # primary objective
    feasible: bool = False
    violations: dict[str, float] = field(default_factory=dict)
    error_rate: float | None = None
    quality: float | None = None
    error: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class Verdict:
    passed: bool
    reason: str
    study: str
    candidate_trial: int | None
    candidate_config: dict[str, Any]
    reference: str  # "champion #<seq>" or "baseline"
    reference_config: dict[str, Any]
    runs: list[ArmRun] = field(default_factory=list)
    test: PairedTest | None = None
    run_id: str | None = None
    champion_seq: int | None = None
    interrupted: bool = False
    # matches the stored verification to its MLflow run (tracking_sync backfills one MLflow missed)
    uid: str = field(default_factory=lambda: uuid.uuid4().hex)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"passed": self.passed, "reason": self.reason, "study": self.study,
                               "trial": self.candidate_trial, "reference": self.reference,
                               "run_id": self.run_id, "champion_seq": self.champion_seq, "uid": self.uid,
                               "pairs": sum(1 for r in self.runs if r.arm == "B")}
        if self.test is not None:
            out.update(improvement=self.test.improvement, improvement_low=self.test.improvement_low,
                       p_value=self.test.p_value, method=self.test.method)
        return out


def reference_for(session: Session, store: ChampionStore) -> tuple[str, dict[str, Any], ChampionRecord | None]:
    """Arm A: the champion, or the baseline (all defaults) when there is none."""
    champ = store.champion()
    if champ is not None:
        return f"champion #{champ.seq}", dict(champ.config), champ
    space = session.agent.space
    return "baseline", space.full_config(space.defaults()), None


def verify(session: Session, candidate_config: Mapping[str, Any], *, candidate_trial: int | None = None,
           store: ChampionStore | None = None, runs: int | None = None, seed: int | None = None,
           stop_event: threading.Event | None = None, method: str = "t", record: bool = True,
           against_baseline: bool = False) -> Verdict:
    """Interleaved A/B verification of `candidate_config` against the champion (or baseline).

    `against_baseline`: arm A is the baseline (all defaults) even with a champion (the monitor re-verifies
    the champion itself this way after a performance anomaly)."""
    from tuner.targets.base import TrialContext

    spec = session.agent.spec
    promo = spec.promotion
    store = store or champion_store(session)
    stop = stop_event or threading.Event()
    ref_name, ref_config, champ = reference_for(session, store)
    if against_baseline:
        ref_name, ref_config = "baseline", session.agent.space.full_config(session.agent.space.defaults())
    n_pairs = runs or promo.verify_runs
    vid = len(store.verifications()) + 1
    base_seed = seed if seed is not None else spec.workload.seed + VERIFY_SEED_BASE + 1000 * vid
    obj = spec.objectives[0]
    verdict = Verdict(passed=False, reason="", study=session.study.name, candidate_trial=candidate_trial,
                      candidate_config=dict(candidate_config), reference=ref_name, reference_config=ref_config,
                      champion_seq=champ.seq if champ else None)
    ref_probe: list[list[int]] | None = None
    failure: str | None = None
    for i in range(n_pairs):
        for arm, config in (("A", ref_config), ("B", dict(candidate_config))):
            if stop.is_set():
                verdict.interrupted = True
                break
            run_seed = base_seed + 2 * i + (arm == "B")
            label = f"verify-{vid}-{i + 1}-{arm}"
            r = ArmRun(arm=arm, pair=i + 1, seed=run_seed, label=label)
            probe: list[list[int]] | None = None

            def grab(dep: Any) -> None:
                nonlocal probe
                probe = dep.quality_probe()

            ctx = TrialContext(trial_number=candidate_trial if candidate_trial is not None else -1,
                               state_dir=session.state_dir, seed=run_seed, stop_event=stop, label=label)
            try:
                m, _ = _measure_on_gpus(session, config, ctx, grab)
            except Interrupted:
                verdict.interrupted = True
                break
            except TrialError as exc:
                r.error = f"{exc.cause}: {exc}"
            except Exception as exc:  # noqa: BLE001 - a target bug fails the verification, not the daemon
                log.exception("verification run %s raised", label)
                r.error = f"internal_error: {type(exc).__name__}: {exc}"
            else:
                ev = evaluate(m, spec.objectives, spec.slos)
                r.value, r.feasible = ev.values[0], ev.feasible
                r.violations = {k: v for k, v in ev.constraints.items() if v > 0}
                r.error_rate = m.value("error_rate")
                r.metrics = m.metrics()
                if probe is not None:
                    if arm == "A" and ref_probe is None:
                        ref_probe = probe
                    if ref_probe is not None:
                        r.quality = token_agreement(ref_probe, probe)
            verdict.runs.append(r)
            if failure is None:
                failure = _run_failure(r, promo.max_error_rate, promo.min_quality, ref_name)
            if failure is not None and r.arm == "B":
                break  # a broken guardrail in a candidate run: no need to measure on
            if failure is not None and r.error is not None:
                break
        if verdict.interrupted or failure is not None:
            break
    if verdict.interrupted:
        verdict.reason = "interrupted before the verification finished"
    elif failure is not None:
        verdict.reason = failure
    else:
        a = [r.value for r in verdict.runs if r.arm == "A"]
        b = [r.value for r in verdict.runs if r.arm == "B"]
        test = paired_test([float(x) for x in a if x is not None], [float(x) for x in b if x is not None],
                           direction=obj.direction, min_improvement=promo.min_improvement,
                           confidence=promo.confidence, method=method, seed=base_seed)
        verdict.test = test
        verdict.passed = test.passed
        verdict.reason = (
            f"{obj.metric} {'better' if test.passed else 'not shown better'} than {ref_name}: "
            f"{test.improvement:+.1%} (lower {promo.confidence:.0%} bound {test.improvement_low:+.1%}, "
            f"need >= {promo.min_improvement:+.1%}) over {test.n} pairs")
    if record:
        _record_verification(session, store, verdict)
    log.info("verification of trial %s: %s (%s)", candidate_trial, "PASS" if verdict.passed else "FAIL",
             verdict.reason)
    return verdict


def _measure_on_gpus(session: Session, config: Mapping[str, Any], ctx: Any,
                     on_deployment: Callable[[Any], None]) -> tuple[Any, Any]:
    """measure_config on GPUs claimed from the agent's pool, as a trial of the loop gets them."""
    from tuner.loop import measure_config
    from tuner.placement.gpupool import GpuPool

    need = session.target.gpus_needed(config)
    if need > 0:
        pool = GpuPool(session.agent.spec.gpus)
        if pool.total > 0:
            with pool.claim(need, ctx.stop_event, label=ctx.label) as gpus:
                ctx.gpus = tuple(gpus)
                return measure_config(session, dict(config), ctx, on_deployment=on_deployment)
    return measure_config(session, dict(config), ctx, on_deployment=on_deployment)


def _run_failure(r: ArmRun, max_error_rate: float, min_quality: float, ref_name: str) -> str | None:
    who = "candidate" if r.arm == "B" else ref_name
    if r.error is not None:
        return f"{who} run {r.pair} failed: {r.error}"
    if r.arm != "B":
        return None
    if r.violations:
        keys = ", ".join(sorted(r.violations))
        return f"candidate run {r.pair} broke SLO(s): {keys}"
    if r.error_rate is not None and not (r.error_rate < max_error_rate or r.error_rate == 0):
        return f"candidate run {r.pair} error rate {r.error_rate:.3f} >= max_error_rate {max_error_rate}"
    if r.quality is not None and r.quality < min_quality:
        return f"candidate run {r.pair} token agreement {r.quality:.3f} < min_quality {min_quality}"
    return None


def _record_verification(session: Session, store: ChampionStore, v: Verdict) -> None:
    tr = session.tracker
    spec = session.agent.spec
    obj = spec.objectives[0]
    parent = None
    if v.candidate_trial is not None and v.study == session.study.name:  # under the cycle that produced it
        from tuner.tracking.review import trial_parent

        with contextlib.suppress(Exception):
            parent = trial_parent(session.study.trial(v.candidate_trial))
    run_id = tr.start_run(
        f"verify-trial-{v.candidate_trial} {'pass' if v.passed else 'fail'}" if v.candidate_trial is not None
        else "verify", parent_run_id=parent,
        tags={"kind": "verification", "agent": spec.name, "study": v.study, VERIFICATION_KEY_TAG: v.uid,
              "candidate_trial": "" if v.candidate_trial is None else v.candidate_trial,
              "reference": v.reference, "verdict": "pass" if v.passed else "fail", "reason": v.reason[:4000],
              "interrupted": v.interrupted},
        params={"verify_runs": spec.promotion.verify_runs, "min_improvement": spec.promotion.min_improvement,
                "confidence": spec.promotion.confidence, "objective": f"{obj.metric}:{obj.direction}"})
    v.run_id = run_id
    if run_id is not None:
        series: dict[str, list[float]] = {}
        for r in v.runs:
            for k, val in r.metrics.items():
                series.setdefault(f"{r.arm}_{k}", []).append(val)
            if r.quality is not None:
                series.setdefault(f"{r.arm}_quality", []).append(r.quality)
        tr.log_steps(run_id, series)
        if v.test is not None:
            tr.log(run_id, metrics={"improvement": v.test.improvement, "improvement_low": v.test.improvement_low,
                                    "p_value": v.test.p_value, "pairs": v.test.n})
        tr.log_text(run_id, yaml.safe_dump({"candidate": redact(v.candidate_config),
                                            "reference": redact(v.reference_config),
                                            "runs": [asdict(r) for r in v.runs], "verdict": v.summary()},
                                           sort_keys=False), "verification.yaml")
        tr.end_run(run_id, "KILLED" if v.interrupted else "FINISHED")
    if not v.interrupted:
        store.add_verification({**v.summary(), "runs": [
            {"arm": r.arm, "pair": r.pair, "seed": r.seed, "value": r.value, "feasible": r.feasible,
             "error_rate": r.error_rate, "quality": r.quality, "error": r.error} for r in v.runs]})


# ---------------------------------------------------------------- candidates
def select_candidate(session: Session, store: ChampionStore | None = None) -> FrozenTrial | None:
    """The best feasible trial not yet judged that beats the reference's recorded value, else None."""
    spec = session.agent.spec
    store = store or champion_store(session)
    study = session.study
    judged = store.judged(study.name)
    _, ref_config, champ = reference_for(session, store)
    sign = 1.0 if spec.objectives[0].direction == "maximize" else -1.0
    ref_value: float | None = None
    if champ is not None and champ.study == study.name and champ.values:
        ref_value = champ.values[0]
    elif champ is None:
        base = study.baseline()
        if base is not None and base.values and base.user_attrs.get("feasible"):
            ref_value = base.values[0]
    pool = []
    for t in study.trials():
        if t.state.name != "COMPLETE" or not t.user_attrs.get("feasible") or t.number in judged:
            continue
        if not t.values or config_of(session, t) == ref_config:
            continue
        if ref_value is not None and sign * (t.values[0] - ref_value) <= 0:
            continue
        pool.append(t)
    if not pool:
        return None
    return max(pool, key=lambda t: (sign * t.values[0], -t.number))


def config_of(session: Session, t: FrozenTrial) -> dict[str, Any]:
    cfg = t.user_attrs.get("config")
    return dict(cfg) if isinstance(cfg, dict) else session.agent.space.full_config(dict(t.params))
