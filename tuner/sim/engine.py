"""Discrete-event simulation of a vLLM-like server: iteration-level steps, one queue per DP replica.

Continuous batching follows vLLM v1's scheduler: running requests first (each decode takes one token of
the `max_num_batched_tokens` budget, partial prefills continue), then waiting requests FCFS while fewer than
`max_num_seqs` run and their KV blocks fit; when the KV cache cannot hold the next decode tokens, the most
recently admitted request is preempted and later recomputed (prompt + generated tokens prefilled again).

Static batching collects up to `max_num_seqs` requests or waits `batch_timeout_ms` from the oldest one,
then runs that batch to completion: one padded prefill, then decode steps at the full (padded) batch size
until the longest request is done; nothing joins a running batch.

Token emission times are not stored per request per step: a decoding request emits one token at every
step of its replica from `seg` on, so its times are a slice of the replica's step end times.

The event loop (`run_events`: arrivals, step ends, client timeouts, static batches' timeouts) is shared with
the simulator of the reference engine (tuner.sim.refengine), whose replicas schedule as tuner/engine does and
price a step with a cost model fitted to the engine's own measured steps.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from tuner.errors import WorkloadError
from tuner.measure.records import RequestPlan, RequestRecord
from tuner.sim.config import EngineConfig
from tuner.sim.cost import StepCost

WAITING, PREFILLING, DECODING, DONE = 0, 1, 2, 3
MAX_STEPS = 5_000_000  # a guard against a scheduling bug turning into an endless loop


class _Req:
    __slots__ = ("plan", "prompt", "out", "sent_s", "scheduled_s", "gen", "need", "prefilled", "seg",
                 "epoch", "times", "first_s", "done_s", "error", "state", "replica", "arrived_s")

    def __init__(self, plan: RequestPlan, sent_s: float, scheduled_s: float) -> None:
        self.plan = plan
        self.prompt = plan.prompt_tokens
        self.out = plan.output_tokens
        self.sent_s = sent_s
        self.scheduled_s = scheduled_s
        self.arrived_s = sent_s
        self.gen = 0  # tokens emitted before the current decode segment
        self.need = 0  # tokens to prefill in the current residency (prompt + gen at admission)
        self.prefilled = 0
        self.seg = -1  # step index of the first emission of the current decode segment
        self.epoch = 0  # bumped on preemption/abort: invalidates finish-heap entries
        self.times: list[float] = []
        self.first_s: float | None = None
        self.done_s: float | None = None
        self.error: str | None = None
        self.state = WAITING
        self.replica = -1


@dataclass
class SimStats:
    steps: int = 0
    preemptions: int = 0
    graph_steps: int = 0
    batch_tokens: int = 0
    running_sum: int = 0
    peak_waiting: int = 0
    timeouts: int = 0
    rejected: int = 0
    busy_s: float = 0.0


@dataclass
class SimResult:
    records: list[RequestRecord]
    stats: SimStats
    noise_factor: float
    end_s: float
    replica_steps: list[int] = field(default_factory=list)
    # bookkeeping left at the end (KV tokens, decoders, running): all zero unless a request was lost
    leftover: tuple[int, int, int] = (0, 0, 0)


class _Noise:
    """A per-run multiplicative factor on step times (mean 1, CV noise_cv) and a per-step jitter."""

    def __init__(self, noise_cv: float, rng: np.random.Generator | None) -> None:
        self.rng = rng
        self.factor = 1.0
        self.sigma = 0.0
        if noise_cv > 0 and rng is not None:
            self.sigma = math.sqrt(math.log1p(noise_cv**2))
            self.factor = float(rng.lognormal(-self.sigma**2 / 2, self.sigma))
        self._buf: list[float] = []
        self._i = 0

    def step(self) -> float:
        if self.sigma == 0.0 or self.rng is None:
            return self.factor
        if self._i >= len(self._buf):
            # per-step jitter, half the run's sigma: shapes ITL tails, averages out over a run
            s = self.sigma / 2
            self._buf = (self.factor * self.rng.lognormal(-s * s / 2, s, size=4096)).tolist()
            self._i = 0
        self._i += 1
        return self._buf[self._i - 1]


class Replica(Protocol):
    """What the event loop needs of a replica (one scheduler with its own queue)."""

    rid: int
    busy: bool
    wake_at: float | None  # static batching: when the oldest waiting request's timeout expires
    outstanding: int
    waiting: deque[_Req]
    aborts: list[_Req]
    step_end: list[float]

    def start_step(self, t: float) -> float | None:
        """Schedule and price the next step starting at `t`: its end time, or None when nothing runs."""

    def finish_step(self, t_end: float) -> list[_Req]:
        """Account the step that just ended; return the requests it completed."""

    def leftover(self) -> tuple[int, int, int]:
        """Bookkeeping left at the end (KV tokens, decoders, running): zero unless a request was lost."""


class _Replica:
    """One DP replica (TP GPUs) with continuous batching."""

    def __init__(self, rid: int, cfg: EngineConfig, cost: StepCost, noise: _Noise, stats: SimStats) -> None:
        self.rid = rid
        self.cfg = cfg
        self.cost = cost
        self.noise = noise
        self.stats = stats
        self.cap = cfg.memory.kv_capacity_tokens
        self.half_block = cfg.block_size // 2
        self.step_end: list[float] = []
        self.waiting: deque[_Req] = deque()
        self.running: dict[int, _Req] = {}
        self.prefilling: list[_Req] = []
        self.finish: list[tuple[int, int, int, _Req]] = []
        self.aborts: list[_Req] = []
        self.finals: list[_Req] = []
        self.n_dec = 0
        self.ctx_dec = 0
        self.kv_used = 0
        self.busy = False
        self.wake_at: float | None = None
        self.outstanding = 0

    def leftover(self) -> tuple[int, int, int]:
        return self.kv_used, self.n_dec, len(self.running)

    # ------------------------------------------------------------ helpers
    def _fits(self, extra: int, nrun: int) -> bool:
        return self.kv_used + extra + self.half_block * max(0, nrun - 1) <= self.cap

    def _evict(self, r: _Req, k: int, until_s: float | None = None) -> None:
        """Take `r` out of the running set at the start of step k (KV freed, emitted tokens kept)."""
        del self.running[r.plan.index]
        if r.state == DECODING:
            times = self.step_end[r.seg:k]
            if until_s is not None:
                times = [x for x in times if x <= until_s]
            r.times.extend(times)
            r.gen += k - r.seg
            ctx = r.need + (k - 1 - r.seg)
            self.n_dec -= 1
            self.ctx_dec -= ctx
            self.kv_used -= ctx
        else:
            self.kv_used -= r.prefilled
            if r in self.prefilling:
                self.prefilling.remove(r)
        r.epoch += 1
        r.prefilled = 0
        r.seg = -1

    def _preempt_last(self, k: int) -> _Req:
        r = next(reversed(self.running.values()))
        self._evict(r, k)
        r.state = WAITING
        self.waiting.appendleft(r)
        self.stats.preemptions += 1
        return r

    def _apply_aborts(self, k: int) -> None:
        for r in self.aborts:
            if r.state in (DECODING, PREFILLING):
                self._evict(r, k, until_s=r.done_s)
            r.state = DONE
        self.aborts.clear()

    # ------------------------------------------------------------ one step
    def start_step(self, t: float) -> float | None:
        """Schedule and price the next step starting at `t`; None when there is nothing to run."""
        k = len(self.step_end)
        if self.aborts:
            self._apply_aborts(k)
        running = self.running
        while len(running) > 1 and not self._fits(self.n_dec, len(running)):
            self._preempt_last(k)
        cfg = self.cfg
        budget = cfg.max_num_batched_tokens - self.n_dec
        finals: list[_Req] = []
        pre_tokens = 0
        pre_attn = 0.0
        pre_ctx = 0
        chunks = 0
        if self.prefilling:
            for r in list(self.prefilling):
                if budget <= 0 or r.state != PREFILLING:
                    break
                c = min(r.need - r.prefilled, budget)
                while not self._fits(c, len(running)) and len(running) > 1:
                    if self._preempt_last(k) is r:
                        break
                if r.state != PREFILLING or not self._fits(c, len(running)):
                    break
                pre_tokens += c
                pre_attn += c * (r.prefilled + c / 2)
                pre_ctx += r.prefilled + c
                chunks += 1
                r.prefilled += c
                self.kv_used += c
                budget -= c
                if r.prefilled == r.need:
                    self.prefilling.remove(r)
                    finals.append(r)
        waiting = self.waiting
        chunked = cfg.enable_chunked_prefill
        while waiting and budget > 0 and len(running) < cfg.max_num_seqs:
            r = waiting[0]
            if r.state == DONE:  # aborted while waiting
                waiting.popleft()
                continue
            need = r.prompt + r.gen
            if need <= budget:
                c = need
            elif chunked:
                c = budget
            else:
                break
            if not self._fits(c, len(running) + 1):
                break
            waiting.popleft()
            running[r.plan.index] = r
            r.need = need
            r.prefilled = c
            pre_tokens += c
            pre_attn += c * c / 2
            pre_ctx += c
            chunks += 1
            self.kv_used += c
            budget -= c
            if c == need:
                finals.append(r)
            else:
                r.state = PREFILLING
                self.prefilling.append(r)
        if self.n_dec == 0 and pre_tokens == 0:
            return None
        for r in finals:
            r.state = DECODING  # emits at the end of this step
        dt, kind = self.cost.seconds(self.n_dec, self.ctx_dec, pre_tokens, pre_attn, pre_ctx,
                                     sampled=self.n_dec + len(finals), seqs=self.n_dec + chunks)
        dt *= self.noise.step()
        st = self.stats
        st.steps += 1
        st.graph_steps += kind != "eager"
        st.batch_tokens += self.n_dec + pre_tokens
        st.running_sum += len(running)
        st.busy_s += dt
        if len(waiting) > st.peak_waiting:
            st.peak_waiting = len(waiting)
        self.finals = finals
        t_end = t + dt
        self.step_end.append(t_end)
        return t_end

    def finish_step(self, t_end: float) -> list[_Req]:
        """Account the step that just ended; return the requests it completed."""
        k = len(self.step_end) - 1
        self.ctx_dec += self.n_dec
        self.kv_used += self.n_dec
        for r in self.finals:
            r.seg = k
            if r.first_s is None:
                r.first_s = t_end
            heapq.heappush(self.finish, (k + r.out - r.gen - 1, r.plan.index, r.epoch, r))
            self.n_dec += 1
            self.ctx_dec += r.need
        self.finals = []
        done: list[_Req] = []
        finish = self.finish
        while finish and finish[0][0] <= k:
            _, _, epoch, r = heapq.heappop(finish)
            if epoch != r.epoch or r.state != DECODING:
                continue
            r.times.extend(self.step_end[r.seg:k + 1])
            r.gen += k + 1 - r.seg
            ctx = r.need + (k - r.seg)
            self.n_dec -= 1
            self.ctx_dec -= ctx
            self.kv_used -= ctx
            del self.running[r.plan.index]
            r.state = DONE
            r.done_s = t_end
            done.append(r)
        return done


class _StaticReplica(_Replica):
    """One DP replica with static batching: collect, then run the batch to completion."""

    def __init__(self, rid: int, cfg: EngineConfig, cost: StepCost, noise: _Noise, stats: SimStats) -> None:
        super().__init__(rid, cfg, cost, noise, stats)
        self.batch: list[_Req] = []
        self.bstep = 0
        self.maxp = 0
        self.maxo = 0

    def start_step(self, t: float) -> float | None:
        cfg = self.cfg
        self.aborts.clear()  # a static server cannot drop a request from a running batch
        if not self.batch:
            waiting = self.waiting
            while waiting and waiting[0].state == DONE:
                waiting.popleft()
            if not waiting:
                return None
            live = sum(1 for r in waiting if r.state != DONE)
            deadline = waiting[0].arrived_s + cfg.batch_timeout_s
            if live < cfg.max_num_seqs and t < deadline:
                self.wake_at = deadline
                return None
            self.wake_at = None
            used = 0
            batch: list[_Req] = []
            while waiting and len(batch) < cfg.max_num_seqs:
                r = waiting[0]
                if r.state == DONE:
                    waiting.popleft()
                    continue
                size = r.prompt + r.out + self.half_block
                if batch and used + size > self.cap:
                    break
                waiting.popleft()
                used += size
                r.state = PREFILLING
                batch.append(r)
            self.batch = batch
            self.bstep = 0
            self.maxp = max(r.prompt for r in batch)
            self.maxo = max(r.out for r in batch)
        b = len(self.batch)
        if self.bstep == 0:  # one padded prefill of the whole batch
            n = b * self.maxp
            dt, kind = self.cost.seconds(0, 0, n, b * self.maxp * self.maxp / 2, n, sampled=b, seqs=b)
        else:
            dt, kind = self.cost.seconds(b, b * (self.maxp + self.bstep - 1))
        dt *= self.noise.step()
        st = self.stats
        st.steps += 1
        st.graph_steps += kind != "eager"
        st.batch_tokens += b * (self.maxp if self.bstep == 0 else 1)
        st.running_sum += b
        st.busy_s += dt
        st.peak_waiting = max(st.peak_waiting, len(self.waiting))
        t_end = t + dt
        self.step_end.append(t_end)
        return t_end

    def finish_step(self, t_end: float) -> list[_Req]:
        done: list[_Req] = []
        i = self.bstep
        for r in self.batch:
            if i < r.out:
                r.times.append(t_end)
                if i == 0:
                    r.first_s = t_end
                if i == r.out - 1:
                    r.state = DONE
                    r.done_s = t_end
                    r.gen = r.out
                    done.append(r)
        self.bstep += 1
        if self.bstep >= self.maxo:
            self.batch = []
        return done


def simulate(cfg: EngineConfig, plans: Sequence[RequestPlan], *, concurrency: int | None,
             timeout_s: float, noise_cv: float = 0.0, rng: np.random.Generator | None = None,
             stop_sending_s: float | None = None, warmup_s: float = 0.0) -> SimResult:
    """Run `plans` through the configuration. `concurrency` set: closed loop; None: plan arrival times.

    Requests longer than max_model_len are rejected (HTTP 400); a request not done `timeout_s` after it
    was sent is aborted (the client disconnects, the engine frees it) and recorded as a timeout.
    """
    stats = SimStats()
    noise = _Noise(noise_cv, rng)
    cost = StepCost(cfg)
    cls = _StaticReplica if cfg.batching == "static" else _Replica
    reps = [cls(i, cfg, cost, noise, stats) for i in range(cfg.data_parallel_size)]
    return run_events(reps, plans, stats=stats, max_model_len=cfg.max_model_len, concurrency=concurrency,
                      timeout_s=timeout_s, stop_sending_s=stop_sending_s, warmup_s=warmup_s,
                      noise_factor=noise.factor)


def run_events(reps: Sequence[Replica], plans: Sequence[RequestPlan], *, stats: SimStats, max_model_len: int,
               concurrency: int | None, timeout_s: float, stop_sending_s: float | None = None,
               warmup_s: float = 0.0, noise_factor: float = 1.0, ingress_s: float = 0.0) -> SimResult:
    """The event loop over `reps` (each prices its own steps). `ingress_s`: a request reaches its replica's
    queue this long after it is sent (the server's HTTP handling); its timeout counts from the send."""
    heap: list[tuple[float, int, int, object]] = []  # (time, kind, seq, payload)
    seq = 0
    reqs: list[_Req] = []
    records: list[RequestRecord] = []
    closed = concurrency is not None
    n_plans = len(plans)
    next_plan = 0
    kick: set[int] = set()
    mml = max_model_len

    def push(t: float, kind: int, payload: object) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, kind, seq, payload))

    def send(plan: RequestPlan, t: float, scheduled: float) -> None:
        if plan.prompt_tokens + plan.output_tokens > mml:
            stats.rejected += 1
            records.append(RequestRecord(
                index=plan.index, scheduled_s=scheduled, sent_s=t, first_token_s=None, done_s=t,
                prompt_tokens=plan.prompt_tokens, output_tokens=0, status=400, error="http_4xx",
                error_detail=f"prompt ({plan.prompt_tokens}) + output ({plan.output_tokens}) tokens exceed "
                             f"max_model_len ({mml})",
                warmup=plan.warmup or t < warmup_s))
            if closed:
                send_next(t)
            return
        r = _Req(plan, t, scheduled)
        reqs.append(r)
        rep = min(reps, key=lambda x: (x.outstanding, x.rid))
        rep.outstanding += 1
        r.replica = rep.rid
        push(t + timeout_s, 1, r)
        if ingress_s > 0:
            push(t + ingress_s, 3, r)
            return
        r.arrived_s = t
        rep.waiting.append(r)
        kick.add(rep.rid)

    def send_next(t: float) -> None:
        nonlocal next_plan
        if next_plan < n_plans and (stop_sending_s is None or t < stop_sending_s):
            next_plan += 1
            send(plans[next_plan - 1], t, t)

    def do_kicks(t: float) -> None:
        for rid in sorted(kick):
            rep = reps[rid]
            if rep.busy:
                continue
            t_end = rep.start_step(t)
            if t_end is not None:
                rep.busy = True
                push(t_end, 0, rep.rid)
            elif rep.wake_at is not None:
                push(rep.wake_at, 2, rep.rid)
        kick.clear()

    t = 0.0
    if closed:
        assert concurrency is not None
        for _ in range(min(concurrency, n_plans)):
            send_next(0.0)
        do_kicks(0.0)
    steps = 0
    while True:
        arrival = math.inf
        if not closed and next_plan < n_plans:
            arrival = plans[next_plan].arrival_s
            if stop_sending_s is not None and arrival >= stop_sending_s:
                next_plan = n_plans
                arrival = math.inf
        if heap and heap[0][0] <= arrival:
            t, kind, _, payload = heapq.heappop(heap)
            if kind == 0:  # step end
                assert isinstance(payload, int)
                rep = reps[payload]
                rep.busy = False
                for r in rep.finish_step(t):
                    if r.error is not None:
                        continue  # timed out earlier: the client already gave up on it
                    rep.outstanding -= 1
                    if closed:
                        send_next(t)
                kick.add(rep.rid)
                steps += 1
                if steps > MAX_STEPS:
                    raise WorkloadError(f"simulation exceeded {MAX_STEPS} steps", cause="run_failed")
            elif kind == 1:  # client timeout
                assert isinstance(payload, _Req)
                r = payload
                if r.state == DONE:
                    continue
                r.error = "timeout"
                r.done_s = t
                stats.timeouts += 1
                rep = reps[r.replica]
                rep.outstanding -= 1
                if r.state == WAITING:
                    r.state = DONE
                else:
                    rep.aborts.append(r)
                if closed:
                    send_next(t)
                kick.add(rep.rid)
            elif kind == 3:  # a request reaches its replica (after ingress_s)
                assert isinstance(payload, _Req)
                if payload.state != DONE:
                    payload.arrived_s = t
                    reps[payload.replica].waiting.append(payload)
                    kick.add(payload.replica)
            else:  # static batching: the oldest request's timeout expired
                assert isinstance(payload, int)
                rep = reps[payload]
                if rep.wake_at is not None and rep.wake_at <= t:
                    rep.wake_at = None
                    kick.add(rep.rid)
        elif arrival < math.inf:
            t = arrival
            plan = plans[next_plan]
            next_plan += 1
            send(plan, t, plan.arrival_s)
        else:
            break
        if kick:
            do_kicks(t)

    for r in reqs:
        records.append(_record(r, warmup_s))
    records.sort(key=lambda x: x.index)
    left = [rep.leftover() for rep in reps]
    return SimResult(records=records, stats=stats, noise_factor=noise_factor,
                     end_s=max((x.done_s for x in records), default=0.0),
                     replica_steps=[len(rep.step_end) for rep in reps],
                     leftover=(sum(x[0] for x in left), sum(x[1] for x in left), sum(x[2] for x in left)))


def _record(r: _Req, warmup_s: float) -> RequestRecord:
    plan = r.plan
    warm = plan.warmup or r.sent_s < warmup_s
    if r.error is None:
        assert r.done_s is not None
        return RequestRecord(
            index=plan.index, scheduled_s=r.scheduled_s, sent_s=r.sent_s, first_token_s=r.first_s,
            done_s=r.done_s, prompt_tokens=r.prompt, output_tokens=len(r.times),
            token_times_s=tuple(r.times), status=200, warmup=warm)
    assert r.done_s is not None
    times = tuple(x for x in r.times if x <= r.done_s)
    first = r.first_s if r.first_s is not None and r.first_s <= r.done_s else None
    return RequestRecord(
        index=plan.index, scheduled_s=r.scheduled_s, sent_s=r.sent_s, first_token_s=first, done_s=r.done_s,
        prompt_tokens=r.prompt, output_tokens=len(times), token_times_s=times, status=None, error=r.error,
        error_detail=f"no response within {r.done_s - r.sent_s:.1f} s", warmup=warm)
