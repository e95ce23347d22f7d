"""Check and Act: verify a candidate against the champion, promote, roll back, summarise.

Verification deploys the champion (arm A) and the candidate (arm B) alternately, A B A B ..., on the
agent's workload with a different seed per run, so that slow drift of the machine hits both arms. A
one-sided paired test on the per-pair log-ratios of the primary objective must show that the candidate
is better by at least `promotion.min_improvement` with `promotion.confidence`; every SLO must hold in
every candidate run, its error rate must stay under `max_error_rate`, and where the target has a quality
probe its greedy tokens must agree with the reference arm's (the champion, else the baseline) at least
`min_quality`. Without a champion the baseline configuration stands in as arm A.

A promotion writes the champion file atomically, runs the agent's apply command (argument list, no
shell; a failure restores the former champion), registers the configuration in MLflow (alias
`champion`, the former one moved to `previous`) and appends to the audit log, all under a file lock.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from tuner.champion import ChampionRecord, ChampionStore
from tuner.champion_db import champion_store
from tuner.errors import Interrupted, PromotionError, TrialError
from tuner.objectives import evaluate
from tuner.proc import parent_death_preexec  # libc resolved at import, not in the child
from tuner.tracking import VERIFICATION_KEY_TAG, redact

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

    from tuner.loop import Session
    from tuner.tracking import Tracker

log = logging.getLogger(__name__)

APPLY_TIMEOUT_S = 900.0
VERIFY_SEED_BASE = 100_000


# ---------------------------------------------------------------- statistics
@dataclass(frozen=True)
class PairedTest:
    n: int
    improvement: float  # point estimate of the relative improvement (geometric mean of the ratios - 1)
    improvement_low: float  # one-sided lower confidence bound of the relative improvement
    p_value: float  # H0: improvement <= min_improvement
    passed: bool
    method: str


def paired_test(reference: Sequence[float], candidate: Sequence[float], *, direction: str,
                min_improvement: float, confidence: float, method: str = "t", n_boot: int = 4000,
                seed: int = 0) -> PairedTest:
    """One-sided paired test on d_i = log(candidate_i / reference_i) (inverted for minimised metrics)."""
    import numpy as np
    from scipy import stats

    a = np.asarray(reference, dtype=float)
    b = np.asarray(candidate, dtype=float)
    if len(a) != len(b) or len(a) < 2:
        raise ValueError("a paired test needs at least two pairs of equal length")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b)) and np.all(a > 0) and np.all(b > 0)):
        return PairedTest(len(a), math.nan, math.nan, 1.0, False, method)
    d = np.log(b / a) if direction == "maximize" else np.log(a / b)
    n = len(d)
    mean = float(d.mean())
    threshold = math.log1p(min_improvement)
    if method == "bootstrap":
        rng = np.random.default_rng(seed)
        means = rng.choice(d, size=(n_boot, n), replace=True).mean(axis=1)
        low = float(np.quantile(means, 1 - confidence))
        p = float((means <= threshold).mean())
    else:
        sd = float(d.std(ddof=1))
        se = sd / math.sqrt(n)
        if se == 0:
            low = mean
            p = 0.0 if mean > threshold else 1.0
        else:
            low = mean - float(stats.t.ppf(confidence, n - 1)) * se
            p = float(stats.t.sf((mean - threshold) / se, n - 1))
    return PairedTest(n=n, improvement=math.expm1(mean), improvement_low=math.expm1(low), p_value=p,
                      passed=low >= threshold, method=method)


def token_agreement(reference: Sequence[Sequence[int]], other: Sequence[Sequence[int]]) -> float:
    """Share of the reference's greedy tokens reproduced at the same position (over all probe prompts)."""
    total = matched = 0
    for i, ref in enumerate(reference):
        got = other[i] if i < len(other) else []
        total += len(ref)
        matched += sum(1 for j, tok in enumerate(ref) if j < len(got) and got[j] == tok)
    return matched / total if total else 1.0


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
           stop_event: threading.Event | None = None, method: str = "t", record: bool = True) -> Verdict:
    """Interleaved A/B verification of `candidate_config` against the champion (or baseline)."""
    from tuner.targets.base import TrialContext

    spec = session.agent.spec
    promo = spec.promotion
    store = store or champion_store(session)
    stop = stop_event or threading.Event()
    ref_name, ref_config, champ = reference_for(session, store)
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
    from tuner.gpupool import GpuPool
    from tuner.loop import measure_config

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
        from tuner.mlflow_review import trial_parent

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
        if not t.values or _config_of(session, t) == ref_config:
            continue
        if ref_value is not None and sign * (t.values[0] - ref_value) <= 0:
            continue
        pool.append(t)
    if not pool:
        return None
    return max(pool, key=lambda t: (sign * t.values[0], -t.number))


def _config_of(session: Session, t: FrozenTrial) -> dict[str, Any]:
    cfg = t.user_attrs.get("config")
    return dict(cfg) if isinstance(cfg, dict) else session.agent.space.full_config(dict(t.params))


# ---------------------------------------------------------------- apply command
def run_apply(command: Sequence[str] | None, *, champion_file: Path, agent: str, action: str, cwd: Path,
              timeout_s: float = APPLY_TIMEOUT_S) -> None:
    """Run the apply command (argv; `{champion_file}` and `{agent}` are substituted). Raises PromotionError."""
    if not command:
        return
    argv = [a.replace("{champion_file}", str(champion_file)).replace("{agent}", agent) for a in command]
    env = {**os.environ, "TUNER_CHAMPION_FILE": str(champion_file), "TUNER_AGENT": agent, "TUNER_ACTION": action}
    try:
        # its own process group: a timeout kills what the command started too (a script's kubectl, ...)
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=parent_death_preexec(os.getpid()), start_new_session=True)
    except FileNotFoundError:
        raise PromotionError(f"apply command not found: {argv[0]}") from None
    with proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
        except BaseException as exc:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=5.0)
            if isinstance(exc, subprocess.TimeoutExpired):
                raise PromotionError(f"apply command {argv} timed out after {timeout_s:.0f}s") from None
            raise
    if proc.returncode != 0:
        tail = (stderr or stdout or "").strip()[-500:]
        raise PromotionError(f"apply command {argv} exited {proc.returncode}: {tail}")


# ---------------------------------------------------------------- promote / rollback
@dataclass
class PromoteResult:
    record: ChampionRecord
    verdict: Verdict | None
    previous: ChampionRecord | None


def promote_config(store: ChampionStore, tracker: Tracker | None, *, config: Mapping[str, Any],
                   apply_command: Sequence[str] | None, cwd: Path, study: str | None = None,
                   trial: int | None = None, values: Sequence[float] | None = None,
                   evidence: Sequence[str] = (), verified: bool = True, reason: str = "",
                   _locked: bool = False) -> PromoteResult:
    """Make `config` the champion: file (atomic), apply command (rolled back on failure), MLflow, audit."""
    if not _locked:
        with store.lock():
            return promote_config(store, tracker, config=config, apply_command=apply_command, cwd=cwd,
                                  study=study, trial=trial, values=values, evidence=evidence,
                                  verified=verified, reason=reason, _locked=True)
    old = store.champion()
    rec = ChampionRecord(seq=store.next_seq(), agent=store.agent, config=dict(config), study=study, trial=trial,
                         values=list(values) if values is not None else None, reason=reason,
                         evidence=[e for e in evidence if e], verified=verified,
                         previous_seq=old.seq if old else None, model_name=store.agent)
    _switch(store, tracker, rec, old, action="promote", apply_command=apply_command, cwd=cwd,
            previous_for_alias=old)
    store.audit({"action": "promote", "seq": rec.seq, "trial": trial, "study": study,
                 "evidence": rec.evidence, "reason": reason, "verified": verified,
                 "previous_seq": rec.previous_seq, "model_version": rec.model_version})
    if not verified:
        log.warning("PROMOTED WITHOUT VERIFICATION: %s trial %s (%s)", store.agent, trial, reason)
    pending = store.pending()
    if pending is not None and pending.get("trial") == trial and pending.get("study") == study:
        store.clear_pending()
    return PromoteResult(record=rec, verdict=None, previous=old)


def rollback(store: ChampionStore, tracker: Tracker | None, *, apply_command: Sequence[str] | None, cwd: Path,
             reason: str = "operator rollback") -> PromoteResult:
    """Restore the champion that preceded the current one (the same way a promote writes it)."""
    with store.lock():
        cur = store.champion()
        if cur is None:
            raise PromotionError(f"{store.agent} has no champion to roll back")
        if cur.previous_seq is None:
            raise PromotionError(f"{store.agent}'s champion #{cur.seq} has no previous champion to restore")
        prev = store.record(cur.previous_seq)
        if prev is None:
            raise PromotionError(f"champion record #{cur.previous_seq} is missing from {store.history_dir}")
        restored = replace(prev, restored_from=cur.seq)
        before = store.record(prev.previous_seq) if prev.previous_seq is not None else None
        _switch(store, tracker, restored, cur, action="rollback", apply_command=apply_command, cwd=cwd,
                previous_for_alias=before, write_history=False)
        store.audit({"action": "rollback", "seq": restored.seq, "trial": restored.trial, "study": restored.study,
                     "from_seq": cur.seq, "reason": reason, "evidence": [],
                     "model_version": restored.model_version})
        return PromoteResult(record=restored, verdict=None, previous=cur)


def _switch(store: ChampionStore, tracker: Tracker | None, rec: ChampionRecord, old: ChampionRecord | None, *,
            action: str, apply_command: Sequence[str] | None, cwd: Path,
            previous_for_alias: ChampionRecord | None, write_history: bool = True) -> None:
    old_text = store.begin(rec, action)
    try:
        if write_history:
            # register first so that the version lands in the champion file
            if tracker is not None and tracker.enabled:
                rec.model_version = tracker.register_config(
                    store.agent, rec.config, source_run_id=rec.evidence[0] if rec.evidence else None,
                    tags={"agent": store.agent, "trial": rec.trial, "study": rec.study, "seq": rec.seq,
                          "verified": rec.verified})
            store.write_champion(rec)
        else:
            store.set_current(rec)
        run_apply(apply_command, champion_file=store.champion_path, agent=store.agent, action=action, cwd=cwd)
    except BaseException as exc:
        store.restore(old_text)
        store.commit()
        if isinstance(exc, PromotionError | OSError):
            store.audit({"action": f"{action}_failed", "seq": rec.seq, "trial": rec.trial, "reason": str(exc),
                         "evidence": rec.evidence})
            if isinstance(exc, OSError):
                raise PromotionError(f"{action} failed, the former champion stays: {exc}") from exc
            raise PromotionError(f"{action} failed, the former champion stays: {exc}") from None
        raise
    store.commit()
    if tracker is not None and tracker.enabled:
        if rec.model_version is not None:
            tracker.set_alias(store.agent, "champion", rec.model_version)
        prev_version = previous_for_alias.model_version if previous_for_alias else None
        tracker.set_alias(store.agent, "previous", prev_version)


def promote_trial(session: Session, *, trial: int | None = None, skip_verify: bool = False,
                  reverify: bool = False, confirm: Callable[[str], bool] | None = None,
                  stop_event: threading.Event | None = None, reason: str = "",
                  verify_seed: int | None = None) -> PromoteResult:
    """`tuner promote`: pick the trial (given, pending, else the best candidate), verify, confirm, promote."""
    spec = session.agent.spec
    store = champion_store(session)
    with store.lock():
        pending = store.pending()
        champ = store.champion()
        if trial is None and pending is not None and pending.get("study") == session.study.name:
            trial = int(pending["trial"])
        if trial is None:
            best = session.study.best()
            cand = select_candidate(session, store) or (best[0] if best else None)
            if cand is None:
                raise PromotionError(f"{spec.name} has no feasible trial to promote")
            trial = cand.number
        t = session.study.trial(trial)
        if not t.user_attrs.get("feasible") or not t.values:
            raise PromotionError(f"trial {trial} is not a feasible completed trial")
        config = _config_of(session, t)
        if champ is not None and config == champ.config:
            raise PromotionError(f"trial {trial}'s configuration is already the champion (#{champ.seq})")
        verdict: Verdict | None = None
        evidence: list[str] = []
        reusable = (pending is not None and not reverify and pending.get("trial") == trial
                    and pending.get("study") == session.study.name and pending.get("passed")
                    and pending.get("champion_seq") == (champ.seq if champ else None))
        if skip_verify:
            why = f"verification SKIPPED by {reason or 'operator'} (--skip-verify)"
        elif reusable:
            assert pending is not None
            evidence = [pending["run_id"]] if pending.get("run_id") else []
            why = f"pending candidate verified: {pending.get('reason', '')}"
        else:
            verdict = verify(session, config, candidate_trial=trial, store=store, stop_event=stop_event,
                             seed=verify_seed)
            evidence = [verdict.run_id] if verdict.run_id else []
            if not verdict.passed:
                store.audit({"action": "promote_rejected", "trial": trial, "study": session.study.name,
                             "evidence": evidence, "reason": verdict.reason})
                raise PromotionError(f"trial {trial} failed verification: {verdict.reason}")
            why = verdict.reason
        if confirm is not None and not confirm(
                f"Promote trial {trial} of {spec.name} ({why})?\n{yaml.safe_dump(config, sort_keys=True)}"):
            raise PromotionError("promotion cancelled")
        res = promote_config(store, session.tracker, config=config, apply_command=spec.promotion.apply_command,
                             cwd=session.agent.path.parent, study=session.study.name, trial=trial,
                             values=list(t.values), evidence=evidence, verified=not skip_verify,
                             reason=(reason + ": " if reason else "") + why, _locked=True)
        res.verdict = verdict
        return res


def check_and_act(session: Session, *, stop_event: threading.Event | None = None,
                  seed: int | None = None) -> dict[str, Any]:
    """Check (verify the best unjudged candidate) and Act (auto: promote; manual: leave it pending)."""
    spec = session.agent.spec
    store = champion_store(session)
    cand = select_candidate(session, store)
    if cand is None:
        return {"candidate": None, "action": "none"}
    config = _config_of(session, cand)
    verdict = verify(session, config, candidate_trial=cand.number, store=store, stop_event=stop_event, seed=seed)
    out: dict[str, Any] = {"candidate": cand.number, "verdict": verdict.summary(), "action": "none"}
    if verdict.interrupted or not verdict.passed:
        return out
    if spec.promotion.policy == "auto":
        with store.lock():
            champ = store.champion()
            if (champ.seq if champ else None) != verdict.champion_seq:
                out["action"] = "stale"  # the champion changed meanwhile: judge again next cycle
                return out
            res = promote_config(store, session.tracker, config=config, apply_command=spec.promotion.apply_command,
                                 cwd=session.agent.path.parent, study=session.study.name, trial=cand.number,
                                 values=list(cand.values), evidence=[verdict.run_id or ""], verified=True,
                                 reason=f"auto: {verdict.reason}", _locked=True)
        out["action"] = "promoted"
        out["seq"] = res.record.seq
    else:
        store.set_pending({**verdict.summary(), "config": config, "values": list(cand.values),
                           "created_at": time.time()})
        out["action"] = "pending"
    return out


# ---------------------------------------------------------------- summaries (tuner status, history)
def champion_summary(state_dir: Path | str, agent_name: str, store: ChampionStore | None = None
                     ) -> dict[str, Any] | None:
    rec = (store or ChampionStore(Path(state_dir), agent_name)).champion()
    if rec is None:
        return None
    return {"seq": rec.seq, "trial": rec.trial, "study": rec.study, "config": rec.config, "values": rec.values,
            "promoted_at": rec.promoted_at, "age_s": max(0.0, time.time() - rec.promoted_at), "user": rec.user,
            "verified": rec.verified, "evidence": rec.evidence, "model_version": rec.model_version,
            "previous_seq": rec.previous_seq, "restored_from": rec.restored_from}


def pending_summary(state_dir: Path | str, agent_name: str, store: ChampionStore | None = None
                    ) -> dict[str, Any] | None:
    return (store or ChampionStore(Path(state_dir), agent_name)).pending()


def history(state_dir: Path | str, agent_name: str, tracker: Tracker | None = None,
            store: ChampionStore | None = None) -> dict[str, list[Any]]:
    """Cycles (MLflow cycle runs, else the daemon's journal), verifications and promotions of an agent."""
    store = store or ChampionStore(Path(state_dir), agent_name)
    cycles: list[dict[str, Any]] = []
    if tracker is not None and tracker.enabled:
        try:
            runs = tracker.runs("tags.kind = 'cycle'")
        except Exception as exc:  # noqa: BLE001 - history still lists what the files hold
            log.warning("cannot read cycle runs from MLflow: %s", exc)
            runs = []
        for r in runs:
            m, tg = r.data.metrics, r.data.tags
            if tg.get("agent") not in (None, agent_name):
                continue
            cycles.append({"cycle": int(tg.get("cycle", 0) or 0), "run_id": r.info.run_id,
                           "status": r.info.status, "study": tg.get("study"),
                           "start_time": r.info.start_time / 1000, "trials_run": int(m.get("trials_run", 0)),
                           "trials_feasible": int(m.get("trials_feasible", 0)),
                           "best_value": m.get("best_value_0"), "interrupted": tg.get("interrupted") == "True"})
    if not cycles:
        from tuner.champion import read_jsonl

        cycles = [c for c in read_jsonl(store.dir / "cycles.jsonl")]
    cycles.sort(key=lambda c: (c.get("start_time") or 0, c.get("cycle") or 0))
    promotions = [e for e in store.audit_log() if str(e.get("action", "")).startswith(("promote", "rollback",
                                                                                     "recovered"))]
    return {"cycles": cycles, "verifications": store.verifications(), "promotions": promotions}
