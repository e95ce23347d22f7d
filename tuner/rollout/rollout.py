"""The canary rollout of one promotion.

    recover what a dead owner left (journal) -> check the stable replicas (the balancer's health check and
    each replica's /health) -> start the candidate's replica through the agent's target -> add it to the
    balancer at weight 0 -> for each stage: set the weights for the stage's share, collect paired windows
    (canary vs stable, same seconds), watch for a breach every window, judge -> promote (tuner.promotion.act:
    champion file, apply command, MLflow alias, audit) or roll back -> the balancer as before, the canary
    stopped.

Safety: the first stage's share is bounded (`rollout.max_first_stage`), a stage advances only on a passed
judgement, and a breach (the canary down, its error rate over `promotion.max_error_rate`, an SLO broken on its
stage so far) or a significant regression rolls back at once: canary weight 0, its server removed, the stable
weights back, the replica stopped, the champion unchanged. A stage not passed within `max_stage_s` rolls back
too. At 100% the stable replicas get no traffic, so the last stage is judged on the guardrails alone (its
comparison was the stage before). After a promotion the balancer gets its stable weights back and the canary
leaves: the stable replicas take the new champion through the apply command (the deployment system's hook).
Every stage is recorded with its figures: the audit log (`tuner history`), an MLflow run (kind rollout).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from tuner.base.redact import redact_mapping
from tuner.champions.store import ChampionStore
from tuner.errors import PromotionError, TunerError
from tuner.measure.scrape import Snapshot, scrape
from tuner.promotion.act import PromoteResult, promote_config
from tuner.rollout import journal
from tuner.rollout.judge import Window, figures, judge, judged_metrics, merge, slo_breaking
from tuner.rollout.lb import MAX_WEIGHT, LoadBalancer, LoadBalancerError, Server, load_balancer
from tuner.spec import AgentSpec, RolloutSpec
from tuner.study.objectives import goodput_thresholds_ms

if TYPE_CHECKING:
    from tuner.loop import Session
    from tuner.targets.base import Deployment, Target
    from tuner.tracking.tracker import Tracker

log = logging.getLogger(__name__)

CANARY_UP_TIMEOUT_S = 60.0
MIN_BREACH_REQUESTS = 5  # an SLO is judged broken on a stage's canary requests once it has this many


class RolloutRefused(PromotionError):
    """The rollout did not start (stable replicas unhealthy, no stable replica, balancer unreachable)."""


class RolledBack(PromotionError):
    """The canary was rolled back; the champion is unchanged (the daemon's Act records it as this action)."""

    action = "rolled_back"

    def __init__(self, msg: str, result: RolloutResult) -> None:
        super().__init__(msg)
        self.result = result


def stage_weights(percent: float, stable: Mapping[str, int]) -> tuple[int, dict[str, int]]:
    """(canary weight, stable weights) that give the canary `percent` of a round-robin's requests."""
    total = sum(stable.values())
    if percent >= 100:
        return max(1, min(MAX_WEIGHT, max(stable.values(), default=100))), {n: 0 for n in stable}
    c = percent / (100.0 - percent) * total
    k = 1.0
    if c > MAX_WEIGHT:
        k, c = MAX_WEIGHT / c, float(MAX_WEIGHT)
    return max(1, round(c)), {n: (max(1, round(w * k)) if w > 0 else 0) for n, w in stable.items()}


@dataclass
class StageRecord:
    index: int
    percent: float
    canary_weight: int
    stable_weights: dict[str, int]
    share: float  # the canary's share of the weights
    duration_s: float = 0.0
    windows: int = 0
    canary_requests: float = 0.0  # finished on the canary (its histograms)
    stable_requests: float = 0.0
    routed_canary: int = 0  # requests the balancer sent to the canary (HAProxy's count)
    routed_stable: int = 0
    canary_slo_breaking: float = 0.0
    outcome: str = ""  # passed, regressed, breach, timeout, interrupted
    reason: str = ""
    metrics: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class RolloutResult:
    id: str
    outcome: str  # promoted, rolled_back
    reason: str
    stages: list[StageRecord] = field(default_factory=list)
    canary_requests: float = 0.0  # finished on the canary (its histograms)
    canary_routed: int = 0  # sent to it by the balancer
    canary_slo_breaking: float = 0.0  # of those, over a per-request SLO threshold (TTFT counts unfinished ones too)
    promoted: PromoteResult | None = None
    run_id: str | None = None
    duration_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {"rollout": self.id, "outcome": self.outcome, "reason": self.reason,
                "canary_requests": self.canary_requests, "canary_routed": self.canary_routed,
                "canary_slo_breaking": self.canary_slo_breaking,
                "duration_s": self.duration_s, "run_id": self.run_id,
                "stages": [{k: v for k, v in asdict(s).items()} for s in self.stages]}


def _health(addr: str, path: str, timeout_s: float = 5.0) -> bool:
    try:
        with urllib.request.urlopen(f"http://{addr}{path}", timeout=timeout_s) as r:  # noqa: S310 - the replica's
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


class Rollout:
    """One canary rollout (see the module docstring). Call `run` with the agent's promote lock held."""

    def __init__(self, *, spec: AgentSpec, store: ChampionStore, tracker: Tracker | None, target: Target,
                 lb: LoadBalancer, state_dir: Path, agent_dir: Path, apply_command: Sequence[str] | None = None,
                 stop_event: threading.Event | None = None,
                 on_stage: Callable[[StageRecord], None] | None = None) -> None:
        if spec.rollout is None:
            raise PromotionError(f"{spec.name} has no rollout section")
        self.spec = spec
        self.ro: RolloutSpec = spec.rollout
        self.store = store
        self.tracker = tracker
        self.target = target
        self.lb = lb
        self.state_dir = Path(state_dir)
        self.agent_dir = Path(agent_dir)
        self.apply_command = apply_command
        self.stop = stop_event or threading.Event()
        self.on_stage = on_stage
        self.canary = self.ro.load_balancer.canary_server
        self.metrics = judged_metrics(spec.objectives[0].metric, spec.slos, self.ro.metrics)
        self.goodput_ms = goodput_thresholds_ms(spec.slos)
        self.confidence = self.ro.confidence or spec.promotion.confidence
        self.id = uuid.uuid4().hex[:12]
        self._journal: dict[str, Any] = {}

    # ------------------------------------------------------------ preflight
    def stable_servers(self) -> dict[str, Server]:
        """The serving replicas: the backend's servers other than the canary's, with traffic (weight > 0)."""
        return {n: s for n, s in self.lb.servers().items() if n != self.canary and s.weight > 0}

    def check_stable(self) -> dict[str, Server]:
        """Refuse to start unless every stable replica is UP in the balancer and answers its /health."""
        try:
            stable = self.stable_servers()
        except LoadBalancerError as exc:
            raise RolloutRefused(f"rollout refused: {exc}") from None
        if not stable:
            raise RolloutRefused(f"rollout refused: backend {self.lb.backend!r} has no serving replica (weight > 0)")
        bad = [f"{n} ({s.status} in the balancer)" for n, s in stable.items() if not s.up]
        bad += [f"{n} (/health of {s.addr} does not answer 200)" for n, s in stable.items()
                if s.up and not _health(s.addr, self.ro.health_path)]
        if bad:
            raise RolloutRefused("rollout refused: stable replica(s) unhealthy: " + ", ".join(bad))
        return stable

    # ------------------------------------------------------------ the run
    def run(self, config: Mapping[str, Any], *, study: str | None = None, trial: int | None = None,
            values: Sequence[float] | None = None, evidence: Sequence[str] = (), verified: bool = True,
            reason: str = "") -> RolloutResult:
        from tuner.targets.base import TrialContext

        journal.recover(self.store, self.state_dir)
        try:
            stable = self.check_stable()
        except RolloutRefused as exc:
            self.store.audit({"action": "rollout_refused", "trial": trial, "study": study, "reason": str(exc)})
            raise
        weights0 = {n: s.weight for n, s in stable.items()}
        res = RolloutResult(id=self.id, outcome="", reason="")
        t0 = time.monotonic()
        run_id = self._start_run(config, trial, study)
        res.run_id = run_id
        self._journal = {"id": self.id, "lb": self.lb.describe(), "canary": self.canary,
                         "stable_weights": weights0, "trial": trial, "study": study, "phase": "starting"}
        journal.write(self.store, self._journal)
        self.store.audit({"action": "rollout_started", "rollout": self.id, "trial": trial, "study": study,
                          "stages": self.ro.stages, "stable": weights0, "metrics": self.metrics,
                          "reason": reason or "canary rollout", "run_id": run_id})
        ctx = TrialContext(trial_number=trial if trial is not None else -1, state_dir=self.state_dir,
                           stop_event=self.stop, label=f"canary-{self.id}")
        failure: str | None = None
        try:
            with self.target.deploy(dict(config), ctx) as dep:
                failure = self._stages(dep, stable, weights0, res)
                if failure is None:
                    self._step("promoting")
                    res.promoted = promote_config(
                        self.store, self.tracker, config=config, apply_command=self.apply_command,
                        cwd=self.agent_dir, study=study, trial=trial, values=values,
                        evidence=[*evidence, *([run_id] if run_id else [])], verified=verified,
                        reason=(reason + ": " if reason else "") + f"canary rollout {self.id} passed "
                        f"{len(res.stages)} stage(s) on live traffic", _locked=True)
                    self._step("promoted")
                self._restore(weights0)
        except TunerError as exc:
            failure = failure or f"{type(exc).__name__}: {exc}"
            self._restore(weights0)
        except BaseException:
            with contextlib.suppress(Exception):
                self._restore(weights0)
            raise
        res.duration_s = time.monotonic() - t0
        res.canary_requests = sum(s.canary_requests for s in res.stages)
        res.canary_routed = sum(s.routed_canary for s in res.stages)
        res.canary_slo_breaking = sum(s.canary_slo_breaking for s in res.stages)
        res.outcome = "promoted" if failure is None and res.promoted is not None else "rolled_back"
        res.reason = failure or f"promoted as champion #{res.promoted.record.seq if res.promoted else '?'}"
        self._end_run(res, config)
        self.store.audit({"action": f"rollout_{res.outcome}", "rollout": self.id, "trial": trial, "study": study,
                          "seq": res.promoted.record.seq if res.promoted else None, "reason": res.reason,
                          "canary_requests": res.canary_requests, "canary_routed": res.canary_routed,
                          "canary_slo_breaking": res.canary_slo_breaking,
                          "duration_s": round(res.duration_s, 2), "run_id": run_id})
        journal.clear(self.store)
        log.warning("rollout %s of %s: %s (%s)", self.id, self.spec.name, res.outcome.upper(), res.reason)
        return res

    def _step(self, phase: str, **extra: Any) -> None:
        self._journal.update(phase=phase, **extra)
        journal.write(self.store, self._journal)

    def _restore(self, weights0: Mapping[str, int]) -> None:
        self._step("restoring")
        journal.restore(self.lb, self.canary, dict(weights0))

    def _stages(self, dep: Deployment, stable: dict[str, Server], weights0: dict[str, int],
                res: RolloutResult) -> str | None:
        """Run the stages; None when all passed, else why the canary is rolled back."""
        addr = (dep.endpoint or "").removeprefix("http://").removeprefix("https://").rstrip("/")
        if not addr:
            return f"the {self.target.kind} target's deployment has no HTTP endpoint a load balancer can reach"
        self._step("adding", canary_addr=addr)
        self.lb.add_server(self.canary, addr, weight=0, health_path=self.ro.health_path)
        deadline = time.monotonic() + CANARY_UP_TIMEOUT_S
        while not self.lb.servers().get(self.canary, Server(self.canary, "", 0, "")).up:
            if time.monotonic() > deadline or self.stop.is_set():
                return "the canary never came UP in the balancer's health check"
            time.sleep(0.2)
        for i, pct in enumerate(self.ro.stages):
            cw, sw = stage_weights(pct, weights0)
            rec = StageRecord(index=i, percent=pct, canary_weight=cw, stable_weights=sw,
                              share=cw / (cw + sum(sw.values())))
            self._step("stage", stage=i, percent=pct)
            if pct < 100:  # a growing share: the stable weights first only when they shrink
                for n, w in sw.items():
                    self.lb.set_weight(n, w)
                self.lb.set_weight(self.canary, cw)
            else:
                self.lb.set_weight(self.canary, cw)
                for n, w in sw.items():
                    self.lb.set_weight(n, w)
            self._judge_stage(dep, stable, rec)
            res.stages.append(rec)
            self._record_stage(rec)
            if rec.outcome != "passed":
                return f"stage {i + 1} ({pct:g}%): {rec.reason}"
        return None

    def _scrape(self, addrs: Sequence[str]) -> Snapshot | None:
        return merge([scrape(f"http://{a}{self.ro.metrics_path}") for a in addrs])

    def _judge_stage(self, dep: Deployment, stable: dict[str, Server], rec: StageRecord) -> None:
        ro = self.ro
        canary_addr = (dep.endpoint or "").removeprefix("http://").rstrip("/")
        stable_addrs = [s.addr for s in stable.values()]
        all_stable = rec.percent >= 100
        t_start = time.monotonic()
        c0, s0 = self._scrape([canary_addr]), self._scrape(stable_addrs)
        lb0 = self.lb.servers()
        c_prev, s_prev = c0, s0
        pairs: list[tuple[Window, Window]] = []
        max_err = self.spec.promotion.max_error_rate
        while True:
            if self.stop.wait(ro.window_s):
                rec.outcome, rec.reason = "interrupted", "stop requested during the rollout"
                break
            c1, s1 = self._scrape([canary_addr]), self._scrape(stable_addrs)
            lb1 = self.lb.servers()
            if c0 is None or s0 is None:  # a scrape at the stage's start failed: the stage starts now
                c0, s0, lb0 = c0 or c1, s0 or s1, lb1
                c_prev, s_prev = c0, s0
                rec.duration_s = time.monotonic() - t_start
                breach = self._breach(dep, None, lb1.get(self.canary), None, None, rec, max_err)
                if breach is not None or rec.duration_s >= ro.max_stage_s:
                    rec.outcome = "breach" if breach else "timeout"
                    rec.reason = breach or "the replicas' /metrics could not be read"
                    break
                continue
            if c1 is not None and s1 is not None:  # a window is a pair only when both sides were read
                cw = figures(c_prev, c1, self.metrics, self.goodput_ms)
                sw = figures(s_prev, s1, self.metrics, self.goodput_ms)
                c_prev, s_prev = c1, s1
                if cw.requests > 0:
                    rec.windows += 1
                    pairs.append((sw, cw))
            rec.canary_requests = _count(c0, c_prev)
            rec.stable_requests = _count(s0, s_prev)
            rec.canary_slo_breaking = slo_breaking(c0, c_prev, self.goodput_ms)
            cl0, cl1 = lb0.get(self.canary), lb1.get(self.canary)
            rec.routed_canary = (cl1.requests - cl0.requests) if cl0 and cl1 else 0
            rec.routed_stable = sum(lb1[n].requests - lb0[n].requests for n in stable if n in lb0 and n in lb1)
            rec.duration_s = time.monotonic() - t_start
            breach = self._breach(dep, cl0, cl1, c0, c_prev, rec, max_err)
            if breach is not None:
                rec.outcome, rec.reason = "breach", breach
                break
            enough = rec.windows >= ro.min_windows and rec.canary_requests >= ro.min_requests
            if enough:
                if all_stable:
                    rec.outcome = "passed"
                    rec.reason = (f"no breach over {rec.canary_requests:.0f} requests at 100% "
                                  f"(compared with stable at the stage before)")
                    break
                v = judge(pairs, self.metrics, max_regression=ro.max_regression, confidence=self.confidence,
                          totals=self._totals(s0, s_prev, c0, c_prev))
                rec.metrics = [asdict(m) for m in v.metrics]
                if v.regressed or v.passed:
                    rec.outcome = "regressed" if v.regressed else "passed"
                    rec.reason = v.reason
                    break
                rec.reason = v.reason
            if rec.duration_s >= ro.max_stage_s:
                rec.outcome = "timeout"
                rec.reason = (f"not passed within max_stage_s={ro.max_stage_s:g}s ({rec.windows} windows, "
                              f"{rec.canary_requests:.0f} canary requests): {rec.reason or 'too little traffic'}")
                break
        if not rec.metrics and pairs and not all_stable:
            v = judge(pairs, self.metrics, max_regression=ro.max_regression, confidence=self.confidence,
                      totals=self._totals(s0, s_prev, c0, c_prev))
            rec.metrics = [asdict(m) for m in v.metrics]

    def _totals(self, s0: Snapshot | None, s1: Snapshot | None, c0: Snapshot | None,
                c1: Snapshot | None) -> tuple[Window, Window]:
        """(stable, canary) over the stage so far: what goodput is judged on."""
        return figures(s0, s1, self.metrics, self.goodput_ms), figures(c0, c1, self.metrics, self.goodput_ms)

    def _breach(self, dep: Deployment, cl0: Server | None, cl1: Server | None, c0: Snapshot | None,
                c1: Snapshot | None, rec: StageRecord, max_err: float) -> str | None:
        server = getattr(dep, "server", None)
        if server is not None and not server.alive():
            return "the canary's server process died"
        if cl1 is None:
            return "the canary's server left the balancer"
        if not cl1.up:
            return f"the balancer's health check marks the canary {cl1.status}"
        if cl0 is not None:
            sent = cl1.requests - cl0.requests
            errs = (cl1.errors_5xx - cl0.errors_5xx) + (cl1.errors_conn - cl0.errors_conn)
            if sent > 0 and errs > 0 and errs / sent >= max(max_err, 1e-12):
                return f"canary error rate {errs}/{sent} >= promotion.max_error_rate {max_err}"
        if rec.canary_requests >= MIN_BREACH_REQUESTS and c1 is not None:
            stage = figures(c0, c1, [s.metric for s in self.spec.slos], self.goodput_ms).figures
            for slo in self.spec.slos:
                v = stage.get(slo.metric)
                if v is None:
                    continue
                if (slo.max is not None and v > slo.max) or (slo.min is not None and v < slo.min):
                    bound = f"<= {slo.max:g}" if slo.max is not None else f">= {slo.min:g}"
                    return f"SLO broken on the canary: {slo.metric} = {v:.1f} (needs {bound}) over " \
                           f"{rec.canary_requests:.0f} requests"
        return None

    # ------------------------------------------------------------ records
    def _start_run(self, config: Mapping[str, Any], trial: int | None, study: str | None) -> str | None:
        if self.tracker is None or not self.tracker.enabled:
            return None
        return self.tracker.start_run(
            f"rollout-trial-{trial}" if trial is not None else "rollout",
            tags={"kind": "rollout", "agent": self.spec.name, "study": study or "", "rollout": self.id,
                  "candidate_trial": "" if trial is None else trial},
            params={"stages": ",".join(f"{s:g}" for s in self.ro.stages), "window_s": self.ro.window_s,
                    "min_windows": self.ro.min_windows, "min_requests": self.ro.min_requests,
                    "max_regression": self.ro.max_regression, "confidence": self.confidence,
                    "metrics": ",".join(self.metrics)})

    def _record_stage(self, rec: StageRecord) -> None:
        figs = {f"{m['metric']}:improvement": m["improvement"] for m in rec.metrics}
        self.store.audit({"action": "rollout_stage", "rollout": self.id, "trial": self._journal.get("trial"),
                          "stage": rec.index + 1, "percent": rec.percent, "outcome": rec.outcome,
                          "reason": f"stage {rec.index + 1} ({rec.percent:g}%) {rec.outcome}: {rec.reason}",
                          "duration_s": round(rec.duration_s, 2), "windows": rec.windows,
                          "canary_requests": rec.canary_requests, "stable_requests": rec.stable_requests,
                          "routed_canary": rec.routed_canary, "routed_stable": rec.routed_stable,
                          "canary_slo_breaking": rec.canary_slo_breaking, "share": round(rec.share, 4),
                          "figures": {k: v for k, v in figs.items() if v == v}})
        if self.on_stage is not None:
            self.on_stage(rec)

    def _end_run(self, res: RolloutResult, config: Mapping[str, Any]) -> None:
        if res.run_id is None or self.tracker is None:
            return
        series: dict[str, list[float]] = {"stage_percent": [], "stage_duration_s": [], "canary_requests": [],
                                          "stable_requests": [], "canary_slo_breaking": [], "canary_share": []}
        for s in res.stages:
            series["stage_percent"].append(s.percent)
            series["stage_duration_s"].append(s.duration_s)
            series["canary_requests"].append(s.canary_requests)
            series["stable_requests"].append(s.stable_requests)
            series["canary_slo_breaking"].append(s.canary_slo_breaking)
            series["canary_share"].append(s.share)
        for i, s in enumerate(res.stages):  # step i is stage i + 1 in every series (NaN: not judged, not logged)
            by_name = {m["metric"]: m for m in s.metrics}
            for name in self.metrics:
                for k in ("canary", "stable", "improvement", "improvement_low"):
                    v = by_name.get(name, {}).get(k)
                    series.setdefault(f"{name}_{k}", [math.nan] * i).append(v if isinstance(v, float) else math.nan)
        self.tracker.log_steps(res.run_id, series)
        self.tracker.log(res.run_id, metrics={"canary_requests": res.canary_requests,
                                              "canary_slo_breaking": res.canary_slo_breaking,
                                              "stages_passed": sum(s.outcome == "passed" for s in res.stages),
                                              "duration_s": res.duration_s})
        self.tracker.log_text(res.run_id, yaml.safe_dump({"config": redact_mapping(dict(config)), **res.summary()},
                                                         sort_keys=False, default_flow_style=False),
                              "rollout.yaml")
        self.tracker.end_run(res.run_id, "FINISHED")


def _count(before: Snapshot | None, after: Snapshot | None) -> float:
    if after is None or "e2el_ms" not in after.hists:
        return 0.0
    b = before.hists.get("e2el_ms") if before is not None else None
    return after.hists["e2el_ms"].count - (b.count if b is not None else 0.0)


# ---------------------------------------------------------------- entry points
def rollout_for(session: Session, *, target: Target | None = None, stop_event: threading.Event | None = None,
                on_stage: Callable[[StageRecord], None] | None = None) -> Rollout:
    """A Rollout of the session's agent through its `rollout:` section."""
    from tuner.champions.db import champion_store

    spec = session.agent.spec
    if spec.rollout is None:
        raise PromotionError(f"{spec.name} has no rollout section: add `rollout:` (load_balancer, stages) to "
                             f"{session.agent.path}")
    return Rollout(spec=spec, store=champion_store(session), tracker=session.tracker,
                   target=target or session.target,
                   lb=load_balancer(spec.rollout.load_balancer, session.agent.path.parent),
                   state_dir=session.state_dir, agent_dir=session.agent.path.parent,
                   apply_command=spec.promotion.apply_command, stop_event=stop_event, on_stage=on_stage)


def canary_promoter(session: Session, *, stop_event: threading.Event | None = None,
                    ) -> Callable[..., PromoteResult]:
    """A drop-in for tuner.promotion.act.promote_config that promotes through a canary rollout (raises
    RolledBack when the canary is rolled back)."""

    def promote(store: ChampionStore, tracker: Tracker | None, *, config: Mapping[str, Any],
                apply_command: Sequence[str] | None, cwd: Path, study: str | None = None, trial: int | None = None,
                values: Sequence[float] | None = None, evidence: Sequence[str] = (), verified: bool = True,
                reason: str = "", _locked: bool = False) -> PromoteResult:
        ro = rollout_for(session, stop_event=stop_event)
        ro.store, ro.tracker, ro.apply_command = store, tracker, apply_command
        if not _locked:
            with store.lock():
                res = ro.run(config, study=study, trial=trial, values=values, evidence=evidence,
                             verified=verified, reason=reason)
        else:
            res = ro.run(config, study=study, trial=trial, values=values, evidence=evidence, verified=verified,
                         reason=reason)
        if res.promoted is None:
            raise RolledBack(f"canary of trial {trial} rolled back, the champion stays: {res.reason}", res)
        return res.promoted

    return promote


def recover_agent(session: Session) -> dict[str, Any] | None:
    """At a start (the daemon's, a command's): revert the rollout a dead owner left, under the promote lock."""
    from tuner.champions.db import champion_store

    store = champion_store(session)
    if not journal.journal_path(store).is_file():
        return None
    with store.lock():
        return journal.recover(store, session.state_dir)


def last_rollout(store: ChampionStore) -> list[dict[str, Any]]:
    """The audit entries of the agent's latest rollout (started, stages, outcome), oldest first."""
    log_ = store.audit_log()
    start = max((i for i, e in enumerate(log_) if e.get("action") == "rollout_started"), default=None)
    if start is None:
        return []
    rid = log_[start].get("rollout")
    return [e for e in log_[start:] if e.get("rollout") == rid]
