"""Act: promote a verified configuration, roll back, and the daemon's Check-then-Act step.

A promotion writes the champion file atomically, runs the agent's apply command (argument list, no
shell; a failure restores the former champion), registers the configuration in MLflow (alias
`champion`, the former one moved to `previous`) and appends to the audit log, all under a file lock.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from tuner.base.proc import kill_point, parent_death_preexec  # libc resolved at import, not in the child
from tuner.champions.db import champion_store
from tuner.champions.store import ChampionRecord, ChampionStore
from tuner.errors import PromotionError
from tuner.promotion.verify import Verdict, config_of, select_candidate, verify

if TYPE_CHECKING:
    from tuner.loop import Session
    from tuner.tracking.tracker import Tracker

log = logging.getLogger(__name__)


APPLY_TIMEOUT_S = 900.0


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
    _switch(store, tracker, rec, action="promote", apply_command=apply_command, cwd=cwd,
            audit={"action": "promote", "seq": rec.seq, "trial": trial, "study": study, "evidence": rec.evidence,
                   "reason": reason, "verified": verified, "previous_seq": rec.previous_seq},
            clear_pending=[study, trial])
    if not verified:
        log.warning("PROMOTED WITHOUT VERIFICATION: %s trial %s (%s)", store.agent, trial, reason)
    return PromoteResult(record=rec, verdict=None, previous=old)


def rollback(store: ChampionStore, tracker: Tracker | None, *, apply_command: Sequence[str] | None, cwd: Path,
             reason: str = "operator rollback") -> PromoteResult:
    """Restore the champion that preceded the current one (the same way a promote writes it)."""
    with store.lock():
        # a corrupt champion.yaml: the audit log says which history record is in force
        cur = store.champion_in_force() if hasattr(store, "champion_in_force") else store.champion()
        if cur is None:
            raise PromotionError(f"{store.agent} has no champion to roll back")
        if cur.previous_seq is None:
            raise PromotionError(f"{store.agent}'s champion #{cur.seq} has no previous champion to restore")
        prev = store.record(cur.previous_seq)
        if prev is None:
            raise PromotionError(f"champion record #{cur.previous_seq} is missing from {store.history_dir}")
        restored = replace(prev, restored_from=cur.seq)
        _switch(store, tracker, restored, action="rollback", apply_command=apply_command, cwd=cwd,
                audit={"action": "rollback", "seq": restored.seq, "trial": restored.trial,
                       "study": restored.study, "from_seq": cur.seq, "reason": reason, "evidence": []},
                write_history=False)
        return PromoteResult(record=restored, verdict=None, previous=cur)


SWITCH_POINTS = ("begun", "champion_written", "applied", "committed", "audited", "completed", "aliased")
"""The steps of a switch, in order, where a crash test or the fault campaign kills it (tuner.base.proc.kill_point)."""


def _switch(store: ChampionStore, tracker: Tracker | None, rec: ChampionRecord, *, action: str,
            apply_command: Sequence[str] | None, cwd: Path, audit: dict[str, Any],
            clear_pending: list[Any] | None = None, write_history: bool = True) -> None:
    """Put `rec` in force, crash-consistently: the journal first (the former champion); the champion file and the
    apply command; then the commit point (the journal says what is still owed: the audit entry, the pending
    candidate to clear); then those; then MLflow's aliases. A crash before the commit point is undone at the
    next start (the former champion back, a `recovered` audit entry), one after it completed
    (ChampionStore.recover, run by every command that opens the agent); MLflow's aliases follow the champion
    file at every start (tuner.loop.sync_champion_aliases)."""
    old_text = store.begin(rec, action)
    kill_point("begun")
    try:
        if write_history:
            # register first so that the version lands in the champion file
            if tracker is not None and tracker.enabled:
                rec.model_version = tracker.register_config(
                    store.agent, rec.config, source_run_id=rec.evidence[0] if rec.evidence else None,
                    tags={"agent": store.agent, "trial": rec.trial, "study": rec.study, "seq": rec.seq,
                          "verified": rec.verified, "scenario": store.scenario or ""})
            store.write_champion(rec)
        else:
            store.set_current(rec)
        kill_point("champion_written")
        run_apply(apply_command, champion_file=store.champion_path, agent=store.agent, action=action, cwd=cwd)
        kill_point("applied")
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
    finish = {"audit": {**audit, "model_version": rec.model_version, "uid": uuid.uuid4().hex, "time": time.time()},
              "clear_pending": clear_pending}
    store.mark_committed(finish)
    kill_point("committed")
    store.complete(finish)
    kill_point("completed")
    if tracker is not None and tracker.enabled:
        for alias, version in store.aliases().items():
            tracker.set_alias(store.agent, alias, version)
            kill_point("aliased")


def promote_trial(session: Session, *, trial: int | None = None, skip_verify: bool = False,
                  reverify: bool = False, confirm: Callable[[str], bool] | None = None,
                  stop_event: threading.Event | None = None, reason: str = "",
                  verify_seed: int | None = None, promote: Callable[..., PromoteResult] | None = None
                  ) -> PromoteResult:
    """`tuner promote`: pick the trial (given, pending, else the best candidate), verify, confirm, promote
    (through `promote`, promote_config's signature: e.g. tuner.rollout's canary rollout; default promote_config)."""
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
        config = config_of(session, t)
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
        res = (promote or promote_config)(
            store, session.tracker, config=config, apply_command=spec.promotion.apply_command,
            cwd=session.agent.path.parent, study=session.study.name, trial=trial, values=list(t.values),
            evidence=evidence, verified=not skip_verify, reason=(reason + ": " if reason else "") + why,
            _locked=True)
        res.verdict = verdict
        return res


def check_and_act(session: Session, *, stop_event: threading.Event | None = None,
                  seed: int | None = None, promote: Callable[..., PromoteResult] | None = None) -> dict[str, Any]:
    """Check (verify the best unjudged candidate) and Act (auto: promote through `promote`, promote_config by
    default; manual: leave it pending). A promote that declines with an `action` (a canary rolled back) is an
    outcome, not a failure."""
    spec = session.agent.spec
    store = champion_store(session)
    cand = select_candidate(session, store)
    if cand is None:
        return {"candidate": None, "action": "none"}
    config = config_of(session, cand)
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
            # a scenario's champion is applied when the traffic is in that scenario (tuner.scenarios.act)
            apply = spec.promotion.apply_command if session.scenario is None else None
            try:
                res = (promote or promote_config)(
                    store, session.tracker, config=config, apply_command=apply,
                    cwd=session.agent.path.parent, study=session.study.name, trial=cand.number,
                    values=list(cand.values), evidence=[verdict.run_id or ""], verified=True,
                    reason=f"auto: {verdict.reason}", _locked=True)
            except PromotionError as exc:
                if not getattr(exc, "action", None):
                    raise
                out["action"], out["reason"] = exc.action, str(exc)  # type: ignore[attr-defined]
                return out
        out["action"] = "promoted"
        out["seq"] = res.record.seq
    else:
        store.set_pending({**verdict.summary(), "config": config, "values": list(cand.values),
                           "created_at": time.time()})
        out["action"] = "pending"
    return out
