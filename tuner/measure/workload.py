"""Workloads: turn a WorkloadSpec into a list of request plans (arrival times and lengths).

Open-loop arrivals (constant, Poisson, gamma) are scheduled on a clock; closed-loop plans carry
arrival 0 and the sender keeps `concurrency` requests in flight.
"""

from __future__ import annotations

import numpy as np

from tuner.errors import ConfigError
from tuner.measure.records import RequestPlan
from tuner.spec import MAX_REQUESTS, LengthDist, WorkloadSpec


def sample_lengths(dist: LengthDist, n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` token counts from `dist`, rounded and clipped to [min, max]."""
    if dist.dist == "fixed":
        assert dist.value is not None
        x = np.full(n, float(dist.value))
    elif dist.dist == "uniform":
        assert dist.low is not None and dist.high is not None
        x = rng.integers(dist.low, dist.high + 1, size=n).astype(float)
    elif dist.dist == "normal":
        assert dist.mean is not None and dist.std is not None
        x = rng.normal(dist.mean, dist.std, size=n)
    else:  # lognormal with the given mean: mu = ln(mean) - sigma^2/2
        assert dist.mean is not None and dist.sigma is not None
        mu = np.log(dist.mean) - dist.sigma**2 / 2
        x = rng.lognormal(mu, dist.sigma, size=n)
    return np.clip(np.rint(x), dist.min, dist.max).astype(int)


def arrival_times(kind: str, rate_per_s: float, n: int, rng: np.random.Generator,
                  burstiness: float = 1.0) -> np.ndarray:
    """Arrival offsets (s) of `n` requests for an open-loop process with mean rate `rate_per_s`."""
    if kind == "constant":
        gaps = np.full(n, 1.0 / rate_per_s)
    elif kind == "poisson":
        gaps = rng.exponential(1.0 / rate_per_s, size=n)
    elif kind == "gamma":
        # shape k = burstiness, scale so that the mean gap is 1/rate; k<1 is burstier than Poisson
        gaps = rng.gamma(burstiness, 1.0 / (rate_per_s * burstiness), size=n)
    else:
        raise ValueError(f"not an open-loop arrival kind: {kind!r}")
    gaps[0] = 0.0
    return np.cumsum(gaps)


def fixed_rate(spec: WorkloadSpec) -> float | None:
    """The open-loop rate of `spec` (None for closed loops and traces); refuses a rate still `auto`."""
    r = spec.arrival.rate_per_s
    if r == "auto":
        raise ConfigError("workload.arrival.rate_per_s is 'auto' and was not sized: `tuner run` sizes it on "
                          "the baseline before the first trial; elsewhere give a number", field="workload.arrival")
    return None if r is None else float(r)


def request_count(spec: WorkloadSpec) -> int:
    """How many measured requests to plan (duration-bound runs plan enough to fill the duration)."""
    if spec.num_requests is not None:
        return spec.num_requests
    assert spec.duration_s is not None
    rate = fixed_rate(spec)
    if rate is not None:
        planned = rate * spec.duration_s * 1.2 + 8
        if planned + spec.warmup_requests > MAX_REQUESTS:  # a rate `auto` sized to more than the spec's check saw
            raise ConfigError(f"rate_per_s {rate:g} x duration_s {spec.duration_s:g} plans {planned:.0f} requests, "
                              f"over {MAX_REQUESTS} (requests of one trial): shorten duration_s",
                              field="workload.duration_s")
        return max(1, int(np.ceil(planned)))
    return 100_000  # closed loop bounded by duration


def build_plans(spec: WorkloadSpec, *, seed: int | None = None) -> list[RequestPlan]:
    """The request plans of one run: warm-up requests first, then the measured ones."""
    rng = np.random.default_rng(spec.seed if seed is None else seed)
    n_meas = request_count(spec)
    n = spec.warmup_requests + n_meas
    if spec.tasks:
        weights = np.array([t.weight for t in spec.tasks], dtype=float)
        choice = rng.choice(len(spec.tasks), size=n, p=weights / weights.sum())
        p_len = np.empty(n, dtype=int)
        o_len = np.empty(n, dtype=int)
        for i, task in enumerate(spec.tasks):
            idx = np.nonzero(choice == i)[0]
            p_len[idx] = sample_lengths(task.prompt_tokens, len(idx), rng)
            o_len[idx] = sample_lengths(task.output_tokens, len(idx), rng)
        names = [spec.tasks[c].name for c in choice]
    else:
        p_len = sample_lengths(spec.prompt_tokens, n, rng)
        o_len = sample_lengths(spec.output_tokens, n, rng)
        names = ["generation"] * n
    a = spec.arrival
    rate = fixed_rate(spec)
    if a.kind in ("constant", "poisson", "gamma"):
        assert rate is not None
        t = arrival_times(a.kind, rate, n, rng, a.burstiness)
    else:
        t = np.zeros(n)
    return [
        RequestPlan(
            index=i,
            arrival_s=float(t[i]),
            prompt_tokens=int(p_len[i]),
            output_tokens=int(o_len[i]),
            task=names[i],
            warmup=i < spec.warmup_requests,
        )
        for i in range(n)
    ]
