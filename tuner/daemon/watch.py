"""The production watch: scrape the live server's /metrics every `watch.interval_s` and hand each scrape to
its consumers (`consumers_for`): the anomaly check (SLO breaches and prompt-length drift: record the anomaly and
start the agent's cycle early), the observation window (tuner.daemon.traffic: the workload the next cycle
tunes), the scenario switcher, and whatever CONSUMERS adds."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tuner import catalog
from tuner.base.redact import redact_text, redact_url
from tuner.champions.store import append_jsonl
from tuner.daemon.runtime import AgentState, Runtime
from tuner.measure.datasets import plans_for
from tuner.measure.scrape import Snapshot, finished_mean_length, scrape, telemetry
from tuner.measure.tokenize import load_tokenizer
from tuner.spec import AgentSpec, WorkloadSpec
from tuner.tracking.tracker import Tracker

log = logging.getLogger(__name__)



# A consumer of the watch's scrapes: called with (unix time of the scrape, the Snapshot), in the watch thread.
Consumer = Callable[[float, Snapshot], None]
# Factories of further consumers, (rt, st, spec) -> Consumer, appended to by packages that read every scrape
# (e.g. change detection); each watch builds one consumer per factory.
CONSUMERS: list[Callable[[Runtime, AgentState, AgentSpec], Consumer]] = []


def start_watch(rt: Runtime, st: AgentState, spec: AgentSpec) -> None:
    """Start the agent's production watch (if its spec has one), ending the one that ran before."""
    if st.watch_stop is not None:
        st.watch_stop.set()
        st.watch_stop = None
    st.watch = spec.watch.model_dump() if spec.watch is not None else None
    if spec.watch is None or rt.stop.is_set():
        return
    st.watch_stop = threading.Event()
    threading.Thread(target=watch_loop, args=(rt, st, spec, st.watch_stop), name=f"tuner-watch-{st.name}",
                     daemon=True).start()


def consumers_for(rt: Runtime, st: AgentState, spec: AgentSpec,
                  extra: Sequence[Callable[[Runtime, AgentState, AgentSpec], Consumer]] = ()) -> list[Consumer]:
    """What each scrape is handed to, in order: the anomaly check, the observation window, the scenario
    switcher (when the agent has scenarios or proposes them), then CONSUMERS and `extra`."""
    from tuner.daemon.traffic import ObservationWindow, ScenarioSwitching

    out: list[Consumer] = [AnomalyCheck(rt, st, spec), ObservationWindow(st, spec)]
    if spec.scenarios or spec.switching.propose:
        out.append(ScenarioSwitching(rt, st, spec))
    return out + [make(rt, st, spec) for make in (*CONSUMERS, *extra)]


def watch_loop(rt: Runtime, st: AgentState, spec: AgentSpec, done: threading.Event) -> None:
    w = spec.watch
    if w is None:
        return
    feed = consumers_for(rt, st, spec)
    while not done.wait(w.interval_s):
        snap = scrape(w.url)
        if snap is None:
            continue
        now = time.time()
        for consume in feed:
            try:
                consume(now, snap)
            except Exception as exc:  # noqa: BLE001 - one failing consumer must not end the watch for good
                log.warning("watch %s: %s failed on the scrape of %s: %s", st.name, type(consume).__name__,
                            redact_url(w.url), redact_text(f"{type(exc).__name__}: {exc}"))


class AnomalyCheck:
    """SLO breaches and prompt-length drift over the watch's window: recorded, and the agent's cycle started
    now (then quiet for one window)."""

    def __init__(self, rt: Runtime, st: AgentState, spec: AgentSpec) -> None:
        self.rt, self.st, self.spec = rt, st, spec
        self.history: list[tuple[float, Snapshot]] = []
        self.cooldown_until = 0.0

    def __call__(self, now: float, snap: Snapshot) -> None:
        w = self.spec.watch
        assert w is not None
        st, rt = self.st, self.rt
        self.history.append((now, snap))
        self.history = [(t, s) for t, s in self.history if now - t <= w.window_s + w.interval_s]
        base = self.history[0][1] if len(self.history) > 1 else None
        if base is None or now < self.cooldown_until:
            return
        # with scenarios, the switcher follows the traffic's moves; prompt drift is judged without them
        tuned = self.spec.model_copy(update={"workload": tuned_workload(rt.state_dir, self.spec)})
        anomalies = detect_anomalies(tuned, base, snap, st.path.parent, drift=not self.spec.scenarios)
        if not anomalies:
            return
        self.cooldown_until = now + w.window_s
        for kind, detail in anomalies:
            rt.metrics.anomalies.labels(st.name, kind).inc()
            log.warning("watch %s: %s (%s): starting a cycle now", st.name, kind, detail)
        try:
            record_anomaly(rt, self.spec, anomalies)
        except OSError as exc:
            log.warning("watch %s: cannot record the anomaly: %s", st.name, exc)
        from tuner.daemon.traffic import trigger_cycle

        trigger_cycle(rt, st, "production anomaly")


def detect_anomalies(spec: AgentSpec, before: Snapshot, after: Snapshot,
                     base_dir: Path | None = None, *, drift: bool = True) -> list[tuple[str, str]]:
    """SLO breaches of the latencies the server reports (TTFT, ITL, E2EL) and (with `drift`) prompt-length drift
    from the spec's workload between two scrapes of production /metrics.

    `base_dir` (the agent file's folder) resolves the workload's dataset or trace path."""
    tel = telemetry(before, after)
    out: list[tuple[str, str]] = []
    for slo in spec.slos:
        key = catalog.server_key(slo.metric)  # the server's own histogram of the same latency
        if slo.max is not None and key is not None and key in tel and tel[key] > slo.max:
            out.append(("slo", f"{slo.metric} {tel[key]:.1f} > {slo.max}"))
    mean_now = finished_mean_length(before, after, "prompt_tokens")
    if drift and mean_now is not None and spec.watch is not None:
        tuned = tuned_prompt_mean(spec.workload, base_dir)
        if tuned and abs(mean_now - tuned) / tuned > spec.watch.drift_threshold:
            out.append(("drift", f"mean prompt {mean_now:.0f} tokens vs {tuned:.0f} tuned for"))
    return out


def tuned_workload(state_dir: Path, spec: AgentSpec) -> WorkloadSpec:
    """The workload the configuration in service was tuned for: the fitted one of the scenario in service (or of
    the agent's own study, once it tuned observed traffic), else the agent's."""
    from tuner.scenarios.store import ScenarioBook

    book = ScenarioBook(state_dir, spec.name)
    service = book.service()
    fitted = book.fitted(service["scenario"] if service else None)
    return WorkloadSpec.model_validate(fitted["workload"]) if fitted else spec.workload


def tuned_prompt_mean(workload: WorkloadSpec, base_dir: Path | None = None) -> float:
    """Mean prompt length of the workload the champion was tuned for (from its request plans).

    A dataset or trace gives the prompts (and their lengths); `base_dir` resolves its relative path.
    """
    tok = load_tokenizer(None, seed=workload.seed)
    all_plans, _ = plans_for(workload, seed=workload.seed, tok=tok, base_dir=base_dir)
    plans = [p for p in all_plans if not p.warmup]
    return sum(p.prompt_tokens for p in plans) / len(plans) if plans else 0.0


def record_anomaly(rt: Runtime, spec: AgentSpec, anomalies: list[tuple[str, str]]) -> None:
    sd = Path(rt.state_dir)
    tr = Tracker.for_agent(spec, sd)
    run_id = tr.start_run("anomaly", tags={"kind": "anomaly", "agent": spec.name,
                                           "anomalies": "; ".join(f"{k}: {d}" for k, d in anomalies)})
    tr.end_run(run_id)
    append_jsonl(sd / spec.name / "anomalies.jsonl",
                 {"time": time.time(), "anomalies": [{"kind": k, "detail": d} for k, d in anomalies]})
