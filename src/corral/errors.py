"""corral's error tree: every error corral raises on purpose derives from CorralError.

    CorralError
    ├── ConfigError            bad settings (exit 2)
    ├── InvalidInput           a request corral refuses at the edge (exit 2)
    │   ├── PayloadTooLarge
    │   └── Conflict           the request does not fit the thing's state now
    │       └── CountChanged   a bulk filter matches another number of jobs than confirmed
    ├── IllegalTransition      a state change the transition table does not allow
    ├── NotFound               no such job or attempt (exit 1)
    ├── StaleFence             a newer attempt has replaced the one that asked (exit 3)
    ├── StoreError             the database failed or cannot be reached (exit 1)
    │   ├── SchemaOutOfDate    the database needs `corral db upgrade`
    │   └── StoreUnavailable   no connection: refused, cut, timed out, or no answer in time
    ├── ExecutorError          a platform call failed
    │   ├── LaunchConflict     the launch name exists but carries another identity
    │   ├── LaunchRefused      the platform refused the object as invalid: no retry helps
    │   └── LaunchTooLate      the attempt's deadline passed before it could be launched
    └── Unhealthy              a loop has stopped moving, or has not started (exit 1)

The CLI maps ConfigError and InvalidInput to exit code 2 and every other CorralError to 1.
"""

from __future__ import annotations


class CorralError(Exception):
    """corral could not do what was asked."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class ConfigError(CorralError):
    """Raised when a setting is missing, unknown or breaks a rule."""


class InvalidInput(CorralError):
    """Raised when a submitted job or request is refused at the edge."""


class PayloadTooLarge(InvalidInput):
    """Raised when a job's payload is larger than `max_payload_bytes`."""


class Conflict(InvalidInput):
    """Raised when a request does not fit the state its target is in now (a retry of a job
    that is not quarantined, a resume of a schedule that is not paused)."""


class CountChanged(Conflict):
    """Raised when a bulk operation's filter matches another number of jobs than the
    person confirmed (`count`: how many it matches now)."""

    def __init__(self, count: int, expected: int) -> None:
        super().__init__(
            f"expect: the filter now matches {count} jobs, not {expected}; preview again"
        )
        self.count = count


class NotGranted(CorralError):
    """A tenant asked for what its grant does not give it (an executor): 403."""


class IllegalTransition(CorralError):
    """Raised when a state change is not in the transition table."""


class NotFound(CorralError):
    """Raised when a job or attempt does not exist."""


class StaleFence(CorralError):
    """Raised when an attempt that is no longer its job's current one reports in: it must stop."""


class StoreError(CorralError):
    """Raised when the database fails or cannot be reached."""


class SchemaOutOfDate(StoreError):
    """Raised when the database schema is older than this corral: run `corral db upgrade`."""


class StoreUnavailable(StoreError):
    """Raised when the database server cannot be reached: a connection could not be made or
    was lost, or a call got no answer within timeouts.database_transaction_timeout. Trying
    again later may succeed (long-running commands wait for it at start)."""


class SignatureInvalid(CorralError):
    """A request said to come from corral does not carry a valid signature of its secret."""


class ExecutorError(CorralError):
    """Raised when an executor's platform call fails."""


class LaunchConflict(ExecutorError):
    """Raised when a launch name exists on the platform with another attempt's identity."""


class LaunchRefused(ExecutorError):
    """Raised when the platform refuses a launch's object as invalid (Kubernetes 400/422,
    or an admission policy): launching it again cannot help."""


class LaunchTooLate(ExecutorError):
    """Raised when an attempt's deadline passed before it could be launched: it never ran,
    so it is superseded as never launched (not charged) rather than failed."""


class Unhealthy(CorralError):
    """Raised when a health file is missing, unreadable, or older than allowed."""
