"""Why a measured trial failed as a whole: every request failed, or the error rate broke its SLO and the
failed requests share one cause. The cause and the first error's detail go to the study and MLflow."""

from __future__ import annotations

from collections.abc import Sequence

from tuner.measure.measurement import Measurement
from tuner.measure.metrics import first_errors

CAUSE_ALL_REQUESTS_FAILED = "all_requests_failed"
# Some requests completed, but the error rate broke its SLO and every failed request failed the same way.
CAUSE_REQUEST_ERRORS = "request_errors"


def request_failure(m: Measurement, error_rate_max: float | None) -> tuple[str, str] | None:
    """(cause, detail) when the trial's requests failed as a whole, else None.

    `error_rate_max` is the agent's error_rate SLO (None: none); over it with a single error kind counts too."""
    errors = first_errors(m.records)
    if not errors:
        return None
    completed = m.summary.get("completed", 0.0)
    rate = m.summary.get("error_rate", 0.0)
    over = error_rate_max is not None and rate > error_rate_max and len(errors) == 1
    if completed > 0 and not over:
        return None
    parts = [f"{kind} x{n}: {detail or 'no detail'}" for kind, (n, detail) in sorted(errors.items())]
    if completed == 0:
        return CAUSE_ALL_REQUESTS_FAILED, "every request failed; " + "; ".join(parts)
    return CAUSE_REQUEST_ERRORS, f"error rate {rate:.2f} over the SLO ({error_rate_max}); " + "; ".join(parts)


def error_rate_slo(slos: Sequence[object]) -> float | None:
    """The tightest `error_rate` max among the agent's SLOs."""
    maxes = [getattr(s, "max", None) for s in slos if getattr(s, "metric", None) == "error_rate"]
    vals = [float(v) for v in maxes if v is not None]
    return min(vals) if vals else None
