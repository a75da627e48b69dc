"""Error types shared by the CLI, the engine and the Dagster adapters.

The CLI maps them to exit codes: ConfigError -> 2 (fix the manifest or environment),
RunFailed -> 1 (the run started and failed; nothing was committed past what was delivered).

`retryable` says whether running the same work again can succeed: a broker time-out, a lost
connection, a crashed worker or a missing topic someone creates can; a failed quality gate or a
bad record under `on_error: fail` fails the same way on the same data every time, so neither
Dagster nor the sensors run it again (assets/retries.py turns this into the run's retry tags).
"""


class DponeError(Exception):
    """Base of every error this project raises on purpose.

    `result` carries the run's partial RunResult (gates, counts) when a run raised it.
    """

    result = None
    retryable = True


class ConfigError(DponeError):
    """Bad manifest, missing credentials, unreachable service found before anything was produced."""


class RunFailed(DponeError):
    """A run that started and failed; state did not advance."""


class DataRefused(RunFailed):
    """The data broke a rule the manifest declares (a quality gate, a bad record under
    `on_error: fail`): the same input fails again, so the run is not retried."""

    retryable = False


def is_retryable(exc: BaseException) -> bool:
    """Whether a later attempt of the same run can succeed. Errors raised outside this project
    (a broker, database or JVM failure) count as retryable: retrying is safe, since a failed run
    advances no state."""
    return exc.retryable if isinstance(exc, DponeError) else True
