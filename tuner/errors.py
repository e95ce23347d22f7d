"""Error tree. The CLI maps TunerError to one line and an exit code."""

from __future__ import annotations


class TunerError(Exception):
    """Base of every error the tuner raises on purpose."""

    exit_code = 1


class ConfigError(TunerError):
    """A spec, search space or option is invalid. Message names file, line, field, rule and value."""

    exit_code = 2

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        self.file = file
        self.line = line
        self.field = field
        self.raw_message = message
        where = ""
        if file:
            where = f"{file}:{line}: " if line else f"{file}: "
        what = f"{field}: " if field else ""
        super().__init__(f"{where}{what}{message}")


class TrialError(TunerError):
    """A trial failed. `cause` is a short classified reason recorded on the trial."""

    cause = "error"

    def __init__(self, message: str, *, cause: str | None = None, log_tail: str = "") -> None:
        if cause is not None:
            self.cause = cause
        self.log_tail = log_tail
        super().__init__(message)


class InfeasibleConfig(TrialError):
    """The sampled configuration violates a constraint or cannot apply: never deployed."""

    cause = "infeasible_config"


class DeployError(TrialError):
    """The server could not be started (invalid config, out of memory, port in use, crash)."""

    cause = "deploy_failed"


class NotReadyError(DeployError):
    """The server did not become ready before its deadline."""

    cause = "startup_timeout"


class OutOfMemoryError(DeployError):
    cause = "out_of_memory"


class WorkloadError(TrialError):
    """The workload broke mid-run (server died, too many errors)."""

    cause = "run_failed"


class Interrupted(TrialError):
    """The tuner was asked to stop while a trial ran."""

    cause = "interrupted"


class PromotionError(TunerError):
    """A promote or rollback could not complete; the old champion stays."""


class ObservationError(ConfigError):
    """Production signals do not give a workload: a series is missing or malformed, a window saw no request, a
    trace row is bad. The message names the series (or the file, line and column) and what to fix."""


class StateError(TunerError):
    """A file or store of the state dir is corrupt, unreadable, read-only or full. The message names the file or
    directory, what is wrong and what to do; never reported as empty or absent."""

    exit_code = 4
