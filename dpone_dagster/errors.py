"""Error types shared by the CLI, the engine and the Dagster adapters.

The CLI maps them to exit codes: ConfigError -> 2 (fix the manifest or environment),
RunFailed -> 1 (the run started and failed; nothing was committed past what was delivered).
"""


class DponeError(Exception):
    """Base of every error this project raises on purpose.

    `result` carries the run's partial RunResult (gates, counts) when a run raised it.
    """

    result = None


class ConfigError(DponeError):
    """Bad manifest, missing credentials, unreachable service found before anything was produced."""


class RunFailed(DponeError):
    """A run that started and failed; state did not advance."""
