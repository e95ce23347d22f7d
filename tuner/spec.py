"""Agent spec schemas: one YAML file per tuning agent, validated by pydantic with extra="forbid".

Schemas only: this module imports nothing of the tuner. Loading a file (and everything it names: the search
space, the target's options, the metrics) is tuner.agent's job; errors there name the file, the line, the
field, the rule and the value.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SEED_MAX = 2**31 - 1  # numpy takes seeds below 2**32; a study adds its trial count to the sampler's

# Bounds of every count, duration and period a spec holds (and a target's options: tuner.targets), so a value
# validate accepts is one a trial can run: a number past them is a located error (file, line, field, rule).
MAX_TOKENS = 2**24  # tokens of one prompt or answer (16,777,216; the longest context windows are ~10**7)
MAX_REQUESTS = 1_000_000  # requests of one trial, warm-up included (its plans are held in memory)
MAX_TRIAL_S = 86_400.0  # one day: a trial's duration, warm-up or cool-down, a request's timeout, a start-up
MAX_WALL_S = 366 * 86_400.0  # one year: a budget's wall time, a schedule's period, a watch's window
MIN_PERIOD_S = 1.0  # the shortest schedule period
MAX_CONCURRENCY = 100_000  # requests in flight (closed loop)
MAX_RATE_PER_S = 1_000_000.0  # an open-loop request rate
MAX_TRIALS = 1_000_000  # trials of a budget, a cycle or a start-up design
MAX_GPUS = 4096  # GPUs of a target, GPU ids, parallel trials
MAX_WEIGHT = 1e6  # a task's share of a mix (relative)
MAX_SIGMA = 10.0  # a lognormal's sigma (of the log): e**10 is a factor of 22,026
MAX_WINDOWS = 100_000  # windows of a monitor or a rollout stage
MAX_CANDIDATES = 100  # configurations an agent asks to try first


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# ---------------------------------------------------------------- workload
class LengthDist(_Strict):
    """A distribution of token counts, clipped to [min, max]."""

    dist: Literal["fixed", "uniform", "normal", "lognormal"] = "fixed"
    value: int | None = Field(default=None, ge=1, le=MAX_TOKENS, description="for fixed")
    low: int | None = Field(default=None, ge=1, le=MAX_TOKENS, description="for uniform")
    high: int | None = Field(default=None, ge=1, le=MAX_TOKENS, description="for uniform")
    mean: float | None = Field(default=None, gt=0, le=MAX_TOKENS,
                               description="for normal and lognormal (the mean)")
    std: float | None = Field(default=None, ge=0, le=MAX_TOKENS, description="for normal")
    sigma: float | None = Field(default=None, ge=0, le=MAX_SIGMA, description="for lognormal (of the log)")
    min: int = Field(default=1, ge=1, le=MAX_TOKENS)
    max: int = Field(default=32768, ge=1, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _check(self) -> LengthDist:
        need = {"fixed": ("value",), "uniform": ("low", "high"), "normal": ("mean", "std"),
                "lognormal": ("mean", "sigma")}[self.dist]
        missing = [k for k in need if getattr(self, k) is None]
        if missing:
            raise ValueError(f"dist {self.dist!r} needs {', '.join(missing)}")
        if self.dist == "uniform" and self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError(f"low ({self.low}) must be <= high ({self.high})")
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        return self


class TaskMix(_Strict):
    """One task type of a mix: its share of requests and its own length distributions."""

    name: str
    weight: float = Field(gt=0, le=MAX_WEIGHT)
    prompt_tokens: LengthDist
    output_tokens: LengthDist


class Arrival(_Strict):
    kind: Literal["closed", "constant", "poisson", "gamma", "trace"] = "poisson"
    concurrency: int | None = Field(default=None, ge=1, le=MAX_CONCURRENCY,
                                    description="closed loop: requests in flight")
    rate_per_s: float | Literal["auto"] | None = Field(
        default=None, description="open loop: mean request rate, or auto: `load` x the baseline's sustainable "
        "rate under the SLOs, measured once per study before its first trial")
    load: float | None = Field(default=None, gt=0, le=4, description="with rate_per_s: auto, the fraction of "
                               "the baseline's sustainable rate to offer (default 0.8)")
    burstiness: float = Field(default=1.0, ge=1e-3, le=1e3, description="gamma shape; 1.0 = Poisson")
    trace: str | None = Field(default=None, description="JSONL trace for kind=trace")

    @field_validator("rate_per_s")
    @classmethod
    def _rate(cls, v: float | str | None) -> float | str | None:
        if isinstance(v, float) and not (0 < v <= MAX_RATE_PER_S and math.isfinite(v)):
            raise ValueError(f"must be a finite number greater than 0, or auto (at most {MAX_RATE_PER_S:.0f})")
        return v

    @model_validator(mode="after")
    def _check(self) -> Arrival:
        if self.kind == "closed" and self.concurrency is None:
            raise ValueError("kind 'closed' needs concurrency")
        if self.kind in ("constant", "poisson", "gamma") and self.rate_per_s is None:
            raise ValueError(f"kind {self.kind!r} needs rate_per_s (a rate, or auto)")
        if self.rate_per_s == "auto" and self.kind not in ("constant", "poisson", "gamma"):
            raise ValueError("rate_per_s: auto is for open-loop arrivals (constant, poisson, gamma), "
                             f"not {self.kind!r}")
        if self.load is not None and self.rate_per_s != "auto":
            raise ValueError("load applies only with rate_per_s: auto")
        if self.kind == "trace" and not self.trace:
            raise ValueError("kind 'trace' needs trace (a JSONL file)")
        return self


AUTO_RATE = "auto"
DEFAULT_LOAD = 0.8


class WorkloadSpec(_Strict):
    arrival: Arrival = Arrival(kind="closed", concurrency=8)
    prompt_tokens: LengthDist = LengthDist(dist="fixed", value=256)
    output_tokens: LengthDist = LengthDist(dist="fixed", value=64)
    tasks: list[TaskMix] | None = None
    dataset: str | None = Field(default=None, description="ShareGPT-style JSON or JSONL file")
    num_requests: int | None = Field(default=None, ge=1, le=MAX_REQUESTS)
    duration_s: float | None = Field(default=None, gt=0, le=MAX_TRIAL_S)
    warmup_requests: int = Field(default=0, ge=0, le=MAX_REQUESTS)
    warmup_s: float = Field(default=0.0, ge=0, le=MAX_TRIAL_S)
    cooldown_s: float = Field(default=0.0, ge=0, le=MAX_TRIAL_S)
    endpoint: Literal["completions", "chat"] = "completions"
    stream: bool = True
    ignore_eos: bool | Literal["auto"] = Field(
        default="auto", description="send ignore_eos (answers of the asked length); auto: send it unless the "
        "server refuses the field, then send without it and say so")
    extra_body: dict[str, Any] = Field(default_factory=dict, description="fields added to every request body "
                                       "(a null value removes one the client would send)")
    prompt_format: Literal["text", "token_ids"] = Field(default="text", description="synthesised prompts as "
                                                        "text or as token ids (completions only)")
    timeout_s: float = Field(default=120.0, gt=0, le=MAX_TRIAL_S)
    seed: int = Field(default=0, ge=0, le=SEED_MAX, description="each trial draws with seed + its number")

    @model_validator(mode="after")
    def _check(self) -> WorkloadSpec:
        if self.num_requests is None and self.duration_s is None:
            raise ValueError("set num_requests or duration_s")
        if self.num_requests is not None and self.num_requests + self.warmup_requests > MAX_REQUESTS:
            raise ValueError(f"num_requests + warmup_requests must be at most {MAX_REQUESTS} (requests of one trial)")
        rate = self.arrival.rate_per_s
        if self.num_requests is None and self.duration_s is not None and isinstance(rate, float | int):
            planned = rate * self.duration_s * 1.2 + 8 + self.warmup_requests  # what a duration-bound run plans
            if planned > MAX_REQUESTS:
                raise ValueError(f"rate_per_s x duration_s plans {planned:.0f} requests, over {MAX_REQUESTS} "
                                 "(requests of one trial): shorten duration_s or lower the rate")
        if self.endpoint == "chat" and self.prompt_format == "token_ids":
            raise ValueError("prompt_format 'token_ids' needs endpoint 'completions' (chat messages are text)")
        for key in ("model", "prompt", "messages"):
            if key in self.extra_body:
                raise ValueError(f"extra_body must not set {key!r} (the workload sets it)")
        return self

    @property
    def auto_rate(self) -> bool:
        """True while the open-loop rate is still `auto` (not yet sized on this host)."""
        return self.arrival.rate_per_s == AUTO_RATE

    def with_rate(self, rate_per_s: float) -> WorkloadSpec:
        """This workload at a fixed open-loop rate (the `auto` one resolved)."""
        return self.model_copy(update={"arrival": self.arrival.model_copy(
            update={"rate_per_s": float(rate_per_s), "load": None})})


# ---------------------------------------------------------------- objectives and SLOs
class CapacitySearchSpec(_Strict):
    """The bounded capacity search of the `max_rate_under_slo` objective (tuner.study.rate_objective): per trial,
    short open-loop runs of the workload at rates grown from `start_rate_per_s` until one breaks an upper-bound
    SLO, then narrowed to `rel_tol`; at most `max_runs` runs of `run_s` each."""

    max_runs: int = Field(default=6, ge=2, le=20, description="probe runs per trial at most")
    start_rate_per_s: float = Field(default=4.0, gt=0, le=MAX_RATE_PER_S, description="the first probe's rate")
    min_rate_per_s: float = Field(default=0.25, gt=0, le=MAX_RATE_PER_S, description=(
        "below this rate the search gives up (the trial's value is 0)"))
    max_rate_per_s: float | None = Field(default=None, gt=0, le=MAX_RATE_PER_S, description=(
        "the search does not probe above this rate (null: no cap)"))
    rel_tol: float = Field(default=0.25, gt=0, le=1, description=(
        "the search stops once the bracket [highest passing, lowest failing] is narrower than this share"))
    growth: float = Field(default=2.0, gt=1, le=10, description="rate factor between probes until one fails")
    run_s: float | None = Field(default=None, gt=0, le=MAX_TRIAL_S, description=(
        "seconds of arrivals per probe (null: the workload's duration_s, else long enough for its num_requests "
        "at the probe's rate, within 5-20 s)"))

    @model_validator(mode="after")
    def _check(self) -> CapacitySearchSpec:
        if self.max_rate_per_s is not None and self.max_rate_per_s < self.min_rate_per_s:
            raise ValueError(f"max_rate_per_s ({self.max_rate_per_s:g}) is below min_rate_per_s "
                             f"({self.min_rate_per_s:g})")
        return self


class Objective(_Strict):
    metric: str = Field(description="a name of the metric catalog (tuner.catalog; checked by the loader)")
    direction: Literal["maximize", "minimize"]
    search: CapacitySearchSpec | None = Field(default=None, description=(
        "max_rate_under_slo only: the bounds of its capacity search per trial (default: CapacitySearchSpec())"))


class SLO(_Strict):
    metric: str = Field(description="a name of the metric catalog (tuner.catalog; checked by the loader)")
    max: float | None = None
    min: float | None = None

    @model_validator(mode="after")
    def _check(self) -> SLO:
        if (self.max is None) == (self.min is None):
            raise ValueError("give exactly one of max or min")
        return self

    @property
    def key(self) -> str:
        return f"slo:{self.metric}<={self.max}" if self.max is not None else f"slo:{self.metric}>={self.min}"


class Budget(_Strict):
    trials: int | None = Field(default=20, ge=1, le=MAX_TRIALS)
    wall_time_s: float | None = Field(default=None, gt=0, le=MAX_WALL_S)


class ScreenSpec(_Strict):
    """Proposals judged by the calibrated reference-engine simulator before deployment (tuner.study.screen)."""

    model: str = Field(min_length=1, description="step-cost model file (experiments/sim-calibration fits one on "
                                                 "this host), relative to the agent file")
    slo_slack: float = Field(default=0.5, ge=0, le=100, description=(
        "screen a proposal predicted to break an SLO by more than this fraction of its limit"))
    worse_than_best: float | None = Field(default=3.0, gt=1, le=1e6, description=(
        "screen a proposal whose first objective is predicted this many times worse than the best measured; "
        "null: only the SLO rule"))
    max_per_trial: int = Field(default=20, ge=1, le=1000, description="proposals screened out per trial at most")


class SamplerSpec(_Strict):
    name: str = Field(default="auto", description=(
        "a name of tuner.search.samplers.SAMPLERS (checked by the loader); auto: the default chosen on "
        "experiments/search-suite"))
    seed: int | None = Field(default=0, ge=0, le=SEED_MAX, description="a later cycle reseeds with seed + trials run")
    n_startup_trials: int | None = Field(default=None, ge=0, le=MAX_TRIALS,
                                         description="proposals before the model takes over (baseline excluded "
                                                     "with initial_design: sobol)")
    initial_design: Literal["sampler", "sobol", "sobol-around-defaults", "group-sweep"] = Field(
        default="sampler", description=(
            "sobol: the start-up trials come from a scrambled Sobol design of the whole space that honours the "
            "constraints (tpe, gp); sobol-around-defaults: the same, each knob kept at its default with "
            "probability 1/2; group-sweep: first every allowed joint choice of the categorical knobs a "
            "constraint ties together (tensor x data parallel), the other knobs at their defaults, then "
            "sobol-around-defaults"))
    n_ei_candidates: int | None = Field(default=None, ge=1, le=10_000,
                                        description="tpe: candidates drawn per proposal (Optuna's default 24)")
    multivariate: bool = Field(default=False, description="tpe: model the parameters jointly, in groups of "
                                                          "parameters that occur together (conditional knobs)")
    local_every: int | None = Field(default=None, ge=0, le=100, description=(
        "auto: after the design, every k-th proposal is a local step from the incumbent (0: none; default: "
        "tuner.search.samplers.AUTO_LOCAL_EVERY)"))
    resample_violations: int | None = Field(default=None, ge=0, le=10_000, description=(
        "a proposal that breaks a declared constraint or the target's resources is recorded as rejected (not "
        "deployed, no budget trial) and the sampler asked again, up to this many times per trial; 0: it is spent "
        "as an infeasible trial; default: the sampler's own (tuner.search.samplers.default_resample)"))
    model_guided: bool = Field(default=True, description=(
        "auto: its local steps are the best of candidates drawn in bulk as ranked by a surrogate fitted to the "
        "study's trials (tuner.search.surrogate); false: one random local step"))
    screen: ScreenSpec | None = Field(default=None, description=(
        "torch_engine: the calibrated simulator predicts each proposal; one predicted far outside the SLOs or far "
        "worse than the best is told to Optuna as screened (a prediction, never deployed, no budget trial)"))


class NoiseSpec(_Strict):
    """Run-to-run noise handling (tuner.search.noise): repeats estimate it, the best is ranked by its LCB."""

    repeats: int = Field(default=0, ge=0, le=10, description=(
        "extra measurements of the baseline and of each new best trial (0: off); each is a deployment, "
        "not charged to the trial budget"))
    confidence: float = Field(default=0.95, gt=0.5, lt=1, description="of the interval on the best")
    baseline_repeats: int = Field(default=1, ge=0, le=10, description=(
        "extra measurements of the baseline even with repeats off, so that the run-to-run noise is known and "
        "a best within it is said to be (each is a deployment, not charged to the trial budget)"))


class PruningSpec(_Strict):
    """A running trial whose partial measurement already breaks an upper-bound latency SLO by far is stopped and
    recorded PRUNED with what it measured (tuner.measure.early_stop). The baseline is never pruned."""

    enabled: bool = Field(default=True, description="false: every trial runs its whole workload")
    factor: float = Field(default=3.0, gt=1, le=1e6, description=(
        "prune when a latency SLO's value over the requests completed so far exceeds this many times its max"))
    min_requests: int = Field(default=20, ge=1, le=MAX_REQUESTS, description=(
        "measured requests that must have completed before a trial may be pruned"))
    check_every: int = Field(default=5, ge=1, le=MAX_REQUESTS, description=(
        "completed measured requests between two checks of the partial measurement"))


# user:password@ up to the last '@' a host follows (the password may hold '/', '@', '?', '#'), or a password
# in the query (?password=...); tuner.base.redact masks the same shapes wherever a URL is printed
_URL_PASSWORD_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/@:\s?#]*:\S*@(?=[A-Za-z0-9\[\]._%~-]+(?:[:/?#]|$))"
                              r"|[?&;](?:password|passwd|pwd)=[^&;#]", re.IGNORECASE)


def _no_password(url: str | None, where: str) -> str | None:
    """Refuse a URL that carries a password: specs are shared, copied and logged."""
    if url is not None and _URL_PASSWORD_RE.search(url):
        hint = ("set PGPASSWORD or a ~/.pgpass file (PGPASSFILE)" if url.startswith("postgres")
                else "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD" if where == "tracking"
                else "give it in the environment")
        raise ValueError(f"a password in the URL is refused: {hint}")
    return url


class LeaseSpec(_Strict):
    """A running trial's lease: its owner beats every heartbeat_s; a trial not beaten for timeout_s is lost."""

    heartbeat_s: int = Field(default=5, ge=1, le=3600, description="seconds between two beats (whole seconds)")
    timeout_s: int = Field(default=30, ge=2, le=int(MAX_TRIAL_S), description="a trial not beaten for this long "
                           "is failed")

    @model_validator(mode="after")
    def _check(self) -> LeaseSpec:
        if self.timeout_s < 2 * self.heartbeat_s:
            raise ValueError(f"timeout_s ({self.timeout_s}) must be at least twice heartbeat_s "
                             f"({self.heartbeat_s}): one late beat must not lose a trial")
        return self


class ExecutorSpec(_Strict):
    """Where trials run: `local` (this host's GPU pool) or `ray` (a Ray task per trial, placed by Ray)."""

    kind: Literal["local", "ray"] = "local"
    address: str | None = Field(default=None, description="ray: 'auto', 'host:6379' or 'ray://host:10001'")
    cpus_per_trial: float = Field(default=1.0, ge=0, le=MAX_GPUS)

    @model_validator(mode="after")
    def _check(self) -> ExecutorSpec:
        if self.kind == "local" and self.address is not None:
            raise ValueError("address is for kind 'ray'")
        return self


class TrackingSpec(_Strict):
    uri: str | None = None
    experiment: str | None = None
    enabled: bool = True

    _u = field_validator("uri")(classmethod(lambda cls, v: _no_password(v, "tracking")))


class PromotionSpec(_Strict):
    policy: Literal["manual", "auto"] = "manual"
    verify_runs: int = Field(default=3, ge=2, le=1000)
    min_improvement: float = Field(default=0.02, ge=0, le=1000)
    confidence: float = Field(default=0.95, gt=0.5, lt=1)
    max_error_rate: float = Field(default=0.01, ge=0, le=1)
    min_quality: float = Field(default=0.95, ge=0, le=1)
    apply_command: list[str] | None = None


_EVERY_RE = re.compile(r"^(\d+(\.\d+)?)(s|m|h|d)$")


class ScheduleSpec(_Strict):
    every: str | None = None
    cron: str | None = None
    trials_per_cycle: int | None = Field(default=None, ge=1, le=MAX_TRIALS)

    @field_validator("every")
    @classmethod
    def _every(cls, v: str | None) -> str | None:
        if v is not None and (len(v) > 32 or not _EVERY_RE.match(v)):
            raise ValueError("every must look like 30s, 15m, 6h or 1d")
        if v is not None and float(v[:-1]) <= 0:
            raise ValueError("every must be longer than 0")
        if v is not None and not MIN_PERIOD_S <= _period_s(v) <= MAX_WALL_S:
            raise ValueError(f"every must be between {MIN_PERIOD_S:g} s and {MAX_WALL_S / 86_400:.0f} days")
        return v

    @field_validator("cron")
    @classmethod
    def _cron(cls, v: str | None) -> str | None:
        if v is not None and len(v.split()) != 5:
            raise ValueError("cron must have 5 fields: minute hour day month day_of_week")
        return v

    @model_validator(mode="after")
    def _one(self) -> ScheduleSpec:
        if self.every is not None and self.cron is not None:
            raise ValueError("give every or cron, not both")
        return self

    @property
    def every_s(self) -> float | None:
        if self.every is None:
            return None
        return _period_s(self.every)


def _period_s(every: str) -> float:
    m = _EVERY_RE.match(every)
    assert m
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(3)]


class MonitorSpec(_Strict):
    """The production monitor on the watch's scrapes (tuner.monitor): its windows are the watch's interval."""

    false_alarms_per_day: float = Field(default=1.0, gt=0, le=1e6, description="over all signals; sets the CUSUM "
                                        "threshold (tuner.monitor.detect)")
    learn_windows: int = Field(default=20, ge=3, le=MAX_WINDOWS, description="windows that make a baseline")
    settle_windows: int = Field(default=1, ge=0, le=MAX_WINDOWS,
                                description="an output alarm waits this long for an input "
                                "alarm before it is an anomaly")
    recovery_windows: int = Field(default=3, ge=1, le=MAX_WINDOWS)
    reopen_gap_s: float | None = Field(default=900.0, ge=0, le=7 * 86400, description="an anomaly or saturation "
                                       "that opens again on the same cause within this many seconds of its "
                                       "recovery is the same episode, reopened: recorded, not answered again "
                                       "(no second re-verification); null: every opening a new episode")
    slowdown_to_find_frac: float | None = Field(default=0.3, gt=0, le=10, description="the latency slowdown the "
                                                "monitor is to find fastest (0.3: 30 % slower); its latency CUSUMs "
                                                "take half of it as their allowance, so a host a few percent "
                                                "slower for minutes is no alarm; null: the CUSUM's own k alone")
    drift_to_find_frac: float | None = Field(default=0.5, gt=0, le=10, description="the input drift (request "
                                             "rate, prompt or output length) the monitor is to find fastest (0.5: "
                                             "1.5 times or 1 / 1.5 of normal); its input CUSUMs take half of it as "
                                             "their allowance; null: the CUSUM's own k alone")
    history_windows: int | None = Field(default=None, ge=3, le=MAX_WINDOWS, description="the latencies' "
                                        "baselines learnt again, every learn_windows calm windows, from up to this "
                                        "many of them at the server's usual CPU wait: a host whose speed wanders "
                                        "over the hours is judged against its longer normal (fewer false alarms; "
                                        "a slowdown found a window later where the speed wanders, a slow one "
                                        "partly learnt); at least learn_windows; null: the first baseline kept "
                                        "until a drift; unset: null, or 160 where host_speed_elasticity judges "
                                        "the latencies at the host's speed, whose wander is then read out of "
                                        "them first (experiments/detection, thirty-fifth step)")
    autocorrelation_baselines: int = Field(default=1, ge=1, le=100, description="the autocorrelation that "
                                           "widens a latency baseline: the mean of its own estimate and those of "
                                           "up to this many - 1 baselines learnt before it in the monitor's life "
                                           "(after each drift): a server that wanders now and then is not judged "
                                           "by one relearning's twenty windows alone; 1: each baseline's own "
                                           "(experiments/detection, twenty-fourth step)")
    autocorrelation_horizon: int | None = Field(default=None, ge=1, le=MAX_WINDOWS, description="the windows "
                                                "over which the latencies' autocorrelation widens their scales: "
                                                "that of the mean of so many consecutive windows (a CUSUM of "
                                                "large allowance sums about 3 before it resets or alarms); null: "
                                                "the long-run scale of every sum; unset: null, or 3 where "
                                                "host_speed_elasticity judges the latencies at the speed of the "
                                                "server's own CPU (the probe follows the processes cpu_wait_source "
                                                "names: pid: or title:), whose wander is then read out of them "
                                                "first (experiments/detection, thirty-sixth and thirty-seventh "
                                                "steps)")
    kv_full_frac: float = Field(default=0.95, gt=0, le=1)
    dram_limit_frac: float = Field(default=0.85, gt=0, le=1, description="DRAM active above it is saturation")
    gpus: list[int] = Field(default_factory=list, description="this host's GPU indices to read through NVML "
                            "(once a window: utilisation from NVML's sample buffer, power from the energy counter, "
                            "both over the window)")
    dcgm_prometheus_url: str | None = Field(default=None, description="a Prometheus holding the DCGM "
                                            "exporter's series for the serving GPUs (read as their means over "
                                            "the window where it holds samples in it)")
    dcgm_selector: str = Field(default="", description='label matchers of those GPUs, e.g. Hostname="node-1"')
    cpu_wait_source: str | None = Field(default=None, max_length=4096, description="where the server's wait "
                                        "for a CPU is read (tuner.monitor.contention): pid:<N> (that process's "
                                        "threads), title:<text> (the processes whose title holds it, found again "
                                        "at each read: a restarted server's new processes; vLLM's are "
                                        "title:VLLM::Worker and title:EngineCore) or a PSI file such as its "
                                        "cgroup's cpu.pressure; latencies are then judged at the window's CPU "
                                        "wait")
    cpu_steal_source: str | None = Field(default=None, max_length=4096, description="where the CPU steal of "
                                         "the server's host, a virtual machine, is read (tuner.monitor."
                                         "contention): its /proc/stat (e.g. /proc/stat where the daemon runs on "
                                         "that host), or the http(s) URL of a Prometheus holding node_exporter's "
                                         "node_cpu_seconds_total; the time the hypervisor gave other guests is "
                                         "added to the CPU wait")
    cpu_steal_selector: str = Field(default="", max_length=4096, description="label matchers of that host's "
                                    'node_exporter series in Prometheus, e.g. instance="node-1:9100"')
    host_speed_probe: bool = Field(default=False, description="time three fixed tasks (a 4-MB product streamed "
                                   "through the shared cache, a small product in the core's cache, a Python "
                                   "loop) every half second where the daemon runs (tuner.monitor.hostspeed; "
                                   "about 1-2 ms of CPU each), the signal host_probe_us (their geometric mean); "
                                   "the daemon on the server's host. Where cpu_wait_source names the server's "
                                   "processes (pid: or title:) the tasks run on the CPU its busiest thread is on "
                                   "(each CPU has a speed of its own)")
    host_speed_elasticity: float | None = Field(default=None, ge=0, le=2, description="with host_speed_probe: "
                                                "the ITL mean judged at the host's speed, x (probe / the "
                                                "baseline's) ** -this (a histogram's quantiles are not: its buckets "
                                                "hold them still while the host wanders): the hypervisor's other "
                                                "guests on the server's core or cache are the environment, not a "
                                                "slower champion; the server's "
                                                "slope of log ITL on the log probe over a long calm stretch: 1.0 "
                                                "for vLLM's CPU build with its model in the engine core on one "
                                                "thread (--distributed-executor-backend uni, "
                                                "VLLM_ENABLE_V1_MULTIPROCESSING=0, OMP_NUM_THREADS=1: measured "
                                                "1.01-1.06); none for its default multiprocess executor (the probe "
                                                "explains nothing there) nor a GPU's work unmeasured")
    expect_from_champion: bool = Field(default=True, description="latency expectations from the champion's trial "
                                       "carried to the observed load by the agent's screening simulator "
                                       "(sampler.screen.model), where it has one")
    on_anomaly: Literal["alert", "reverify"] = Field(default="reverify", description="reverify: verify the "
                                                     "champion against the baseline, roll back if it lost")

    _u = field_validator("dcgm_prometheus_url")(classmethod(lambda cls, v: _no_password(v, "dcgm_prometheus_url")))
    _s = field_validator("cpu_steal_source")(classmethod(lambda cls, v: _no_password(v, "cpu_steal_source")))

    @model_validator(mode="after")
    def _history_holds_a_baseline(self) -> MonitorSpec:
        if self.history_windows is not None and self.history_windows < self.learn_windows:
            raise ValueError(f"history_windows ({self.history_windows}) must be at least learn_windows "
                             f"({self.learn_windows}): a baseline is learnt from learn_windows windows")
        if self.host_speed_elasticity is not None and not self.host_speed_probe:
            raise ValueError("host_speed_elasticity judges latencies at the probe's readings: set host_speed_probe: "
                             "true too")
        return self

    @property
    def waits_of_processes(self) -> bool:
        """Whether cpu_wait_source names the server's processes (pid: or title:; validated), not a PSI file: the
        host's speed probe then runs on the CPU its busiest thread is on (tuner.monitor.hostspeed.shared)."""
        return self.cpu_wait_source is not None and self.cpu_wait_source.startswith(("pid:", "title:"))

    @field_validator("cpu_wait_source")
    @classmethod
    def _wait_source(cls, v: str | None) -> str | None:
        if v is not None and v.startswith("pid:") and not v[4:].isdigit():
            raise ValueError("pid:<N> needs a process id (digits), e.g. pid:1234; or name a PSI file")
        if v is not None and v.startswith("title:") and not v[6:].strip():
            raise ValueError("title:<text> needs the text of the server's process title, e.g. title:VLLM::Worker")
        return v


class WatchSpec(_Strict):
    url: str
    interval_s: float = Field(default=60.0, gt=0, le=MAX_TRIAL_S)
    window_s: float = Field(default=600.0, gt=0, le=MAX_WALL_S)
    drift_threshold: float = Field(default=0.3, gt=0, le=1000, description="relative change of mean prompt length")
    monitor: MonitorSpec | None = Field(default=None, description="statistical change detection on the scrapes")


class LoadBalancerSpec(_Strict):
    """The load balancer in front of the serving replicas (tuner.rollout.lb: the HAProxy runtime API)."""

    kind: Literal["haproxy"] = "haproxy"
    socket: str = Field(description="the runtime API: a unix socket path (relative to the agent file) or "
                        "HOST:PORT of a TCP stats socket")
    backend: str = Field(min_length=1, description="the backend whose servers are the stable replicas")
    canary_server: str = Field(default="canary", pattern=r"^[A-Za-z0-9_.-]+$",
                               description="the name the canary's server gets in the backend")


class RolloutSpec(_Strict):
    """A canary rollout of a promotion (tuner.rollout): staged traffic shift, judged on live traffic."""

    load_balancer: LoadBalancerSpec
    stages: list[float] = Field(default=[5.0, 25.0, 50.0, 100.0], min_length=1,
                                description="percent of the traffic on the canary, ascending, ending at 100")
    max_first_stage: float = Field(default=10.0, gt=0, le=100,
                                   description="the most percent a canary gets before its first judgement")
    window_s: float = Field(default=5.0, gt=0, le=MAX_TRIAL_S,
                            description="one paired window: canary and stable, same seconds")
    min_windows: int = Field(default=4, ge=2, le=MAX_WINDOWS,
                             description="paired windows (with canary traffic) per stage")
    min_requests: int = Field(default=20, ge=1, le=MAX_REQUESTS,
                              description="canary requests a stage needs before its judgement")
    max_stage_s: float = Field(default=300.0, gt=0, le=MAX_TRIAL_S, description="a stage not passed by then rolls back")
    max_regression: float = Field(default=0.05, ge=0, lt=1, description="how much worse than stable (relative) "
                                  "a judged metric may be and still pass (non-inferiority margin)")
    confidence: float | None = Field(default=None, gt=0.5, lt=1, description="default: promotion.confidence")
    metrics: list[str] | None = Field(default=None, description="judged metrics (server-observable latencies, "
                                      "goodput_fraction); default: the objective and the SLOs the servers export")
    health_path: str = "/health"
    metrics_path: str = "/metrics"

    @field_validator("stages")
    @classmethod
    def _stages(cls, v: list[float]) -> list[float]:
        if any(not 0 < x <= 100 for x in v):
            raise ValueError("every stage is a percent of the traffic in (0, 100]")
        if any(b <= a for a, b in zip(v, v[1:], strict=False)):
            raise ValueError("stages must be strictly ascending")
        if v[-1] != 100:
            raise ValueError("the last stage must be 100 (the canary takes all the traffic before promotion)")
        return v

    @model_validator(mode="after")
    def _first(self) -> RolloutSpec:
        if self.stages[0] > self.max_first_stage:
            raise ValueError(f"stages[0] = {self.stages[0]:g}% exceeds max_first_stage = "
                             f"{self.max_first_stage:g}%: a canary gets at most that before its first judgement")
        if self.max_stage_s < self.min_windows * self.window_s:
            raise ValueError(f"max_stage_s ({self.max_stage_s:g}) is shorter than min_windows x window_s "
                             f"({self.min_windows * self.window_s:g}): no stage could ever be judged")
        return self


# ---------------------------------------------------------------- scenarios and switching
SCENARIO_DIMS = ("concurrency", "rate_per_s", "prompt_tokens", "output_tokens")


class Bounds(_Strict):
    """A closed interval of one workload statistic (either end may be open: null)."""

    min: float | None = Field(default=None, ge=0, le=MAX_TOKENS)
    max: float | None = Field(default=None, gt=0, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _check(self) -> Bounds:
        if self.min is None and self.max is None:
            raise ValueError("give min, max or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        return self


class ScenarioSpec(_Strict):
    """A named region of workload space: bounds on the observed concurrency (requests in flight), request rate,
    and mean prompt and output lengths (tokens). Traffic inside it is served by the scenario's own champion."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)
    description: str = ""
    concurrency: Bounds | None = None
    rate_per_s: Bounds | None = None
    prompt_tokens: Bounds | None = Field(default=None, description="bounds on the mean prompt length")
    output_tokens: Bounds | None = Field(default=None, description="bounds on the mean output length")
    workload: WorkloadSpec | None = Field(default=None, description="a representative workload to tune on "
                                          "before this scenario's traffic was observed")

    @model_validator(mode="after")
    def _check(self) -> ScenarioSpec:
        if all(getattr(self, d) is None for d in SCENARIO_DIMS):
            raise ValueError(f"a scenario bounds at least one of {', '.join(SCENARIO_DIMS)}")
        return self

    def bounds(self) -> dict[str, Bounds]:
        return {d: b for d in SCENARIO_DIMS if (b := getattr(self, d)) is not None}


class SwitchingSpec(_Strict):
    """When the daemon puts another scenario's champion in service (hysteresis: no flapping at a boundary)."""

    dwell_s: float = Field(default=300.0, gt=0, le=MAX_WALL_S,
                           description="traffic must stay in another scenario this long")
    min_hold_s: float | None = Field(default=None, ge=0, le=MAX_WALL_S,
                                     description="after a switch, no other switch for this "
                                     "long (default: dwell_s)")
    enter_margin: float = Field(default=0.1, ge=0, le=1, description="traffic enters a scenario only this far "
                                "(relative, each bound) inside its bounds")
    exit_margin: float = Field(default=0.2, ge=0, le=4, description="traffic leaves the scenario in force only "
                               "this far (relative, each bound) outside its bounds")
    propose: bool = Field(default=False, description="traffic outside every scenario for dwell_s becomes a "
                          "proposed scenario (its own study and champion) around what was observed")
    propose_width: float = Field(default=2.0, gt=1, le=100, description="a proposed scenario spans the observed "
                                 "statistic divided and multiplied by this factor")
    refit_threshold: float = Field(default=0.3, gt=0, le=1000,
                                   description="a scenario's study keeps the workload it was "
                                   "fitted on until the observed one differs by more than this (relative, any "
                                   "statistic); then a new study, warm-started (tuner.study.lineage)")
    cross_eval_runs: int = Field(default=0, ge=0, le=20, description="after a scenario's champion changes, "
                                 "measure every champion and the baseline on every scenario's workload this many "
                                 "times each (0: only `tuner scenarios evaluate`)")

    @field_validator("cross_eval_runs")
    @classmethod
    def _runs(cls, v: int) -> int:
        if v == 1:
            raise ValueError("0 (off) or at least 2: the gains' intervals come from paired runs")
        return v

    @property
    def hold_s(self) -> float:
        return self.dwell_s if self.min_hold_s is None else self.min_hold_s


class TargetSpec(BaseModel):
    """`kind` plus that kind's options (validated by the target's own options model)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    kind: str

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


def _repeated(names: list[str]) -> list[str]:
    """The names given more than once, sorted."""
    return sorted({n for n in names if names.count(n) > 1})


class CandidateSpec(_Strict):
    """A configuration tried first, right after the baseline, in every study of the agent (each scenario's
    too): a profile the operator already knows (a vendor's recommended settings, what serves today). Knobs
    left out take their defaults; the loader checks the values against the search space."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)
    params: dict[str, Any] = Field(min_length=1, description="knob -> value, knobs of the search space")


class AgentSpec(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    description: str = ""
    target: TargetSpec
    search_space: str | dict[str, Any]
    workload: WorkloadSpec
    objectives: list[Objective] = Field(min_length=1)
    slos: list[SLO] = []
    budget: Budget = Budget()
    sampler: SamplerSpec = SamplerSpec()
    noise: NoiseSpec = NoiseSpec()
    pruning: PruningSpec = PruningSpec()
    storage: str | None = None
    lease: LeaseSpec = LeaseSpec()
    executor: ExecutorSpec = ExecutorSpec()
    tracking: TrackingSpec = TrackingSpec()
    promotion: PromotionSpec = PromotionSpec()
    schedule: ScheduleSpec | None = None
    watch: WatchSpec | None = None
    rollout: RolloutSpec | None = None
    gpus: list[Annotated[int, Field(ge=0, lt=MAX_GPUS)]] | None = Field(
        default=None, min_length=1, max_length=MAX_GPUS, description="GPU ids (default: all NVML sees)")
    parallel_trials: int = Field(default=1, ge=1, le=MAX_GPUS)
    scenarios: list[ScenarioSpec] = Field(default_factory=list, description="named regions of workload space, "
                                          "each with its own study and champion (tuner.scenarios)")
    switching: SwitchingSpec = SwitchingSpec()
    candidates: list[CandidateSpec] = Field(default_factory=list, max_length=MAX_CANDIDATES, description=(
        "configurations each study tries right after the baseline (known profiles; they count against the "
        "budget), then the sampler goes on from them"))

    _s = field_validator("storage")(classmethod(lambda cls, v: _no_password(v, "storage")))

    @field_validator("sampler", mode="before")
    @classmethod
    def _sampler_str(cls, v: Any) -> Any:
        return {"name": v} if isinstance(v, str) else v

    @model_validator(mode="after")
    def _check(self) -> AgentSpec:
        # the rules on metric names (the catalog's) are the loader's: tuner.agent.check_metrics
        if self.workload.auto_rate and not any(s.max is not None for s in self.slos):
            raise ValueError("workload.arrival.rate_per_s: auto sizes the rate on the SLOs: add at least one slo "
                             "with a max")
        if self.budget.trials is None and self.budget.wall_time_s is None:
            raise ValueError("budget needs trials or wall_time_s")
        return self

    @field_validator("candidates")
    @classmethod
    def _unique_candidates(cls, v: list[CandidateSpec]) -> list[CandidateSpec]:
        if dup := _repeated([c.name for c in v]):
            raise ValueError(f"candidate names must be unique: {', '.join(dup)} twice")
        return v

    @field_validator("scenarios")
    @classmethod
    def _unique_scenarios(cls, v: list[ScenarioSpec]) -> list[ScenarioSpec]:
        if dup := _repeated([s.name for s in v]):
            raise ValueError(f"scenario name(s) {', '.join(dup)} given twice")
        return v

