"""corral's error tree: every error corral raises on purpose derives from CorralError.

    CorralError
    ├── ConfigError            bad settings (exit 2)
    ├── InvalidInput           a request corral refuses at the edge (exit 2)
    │   ├── PayloadTooLarge
    │   ├── TemplateError      an HTTP spec's {{placeholder}} names nothing in the payload
    │   └── Conflict           the request does not fit the thing's state now
    │       └── CountChanged   a bulk operation's filter no longer matches the count confirmed
    ├── Refused                corral says no to something it was asked, and says why
    │   ├── RequestRefused     an API request, answered with its HTTP status
    │   ├── NotGranted         a tenant's grant does not give what it asked for (403)
    │   ├── NeedSignIn         a dashboard page asked for without a session: to sign in
    │   ├── Forbidden          a dashboard action the session may not take (403)
    │   ├── PageMissing        a dashboard page of nothing, or of another tenant's (404)
    │   ├── TooManyStreams     a live page past the streams one process serves (429)
    │   ├── QuotaExceeded      a tenant's write would break one of its quotas (403)
    │   │   └── RateLimited    a tenant's submits came faster than its submit_rate (429)
    │   ├── DestinationRefused an address the HTTP executor's guard keeps requests from
    │   └── FieldRefused       a cluster spec's field broke a rule (its executor words it)
    ├── SignatureInvalid       a request said to come from corral is not signed by it
    ├── IllegalTransition      a state change the transition table does not allow
    ├── NotFound               no such job or attempt (exit 1)
    ├── StaleFence             a newer attempt has replaced the one that asked (exit 3)
    │   └── StaleFenceError    a sink refused a write: a newer attempt wrote there first
    ├── AuditFailed            a staged output failed its audit: nothing was published
    ├── StoreError             the database failed or cannot be reached (exit 1)
    │   ├── SchemaOutOfDate    the database needs `corral db upgrade`
    │   └── StoreUnavailable   no connection: refused, cut, timed out, or no answer in time
    ├── ExecutorError          a platform call failed
    │   ├── LaunchConflict     the launch name exists but carries another identity
    │   ├── LaunchRefused      the platform refused the object as invalid: no retry helps
    │   └── LaunchTooLate      the attempt's deadline passed before it could be launched
    ├── Undelivered            an alert channel could not deliver one alert
    ├── PermanentError         a task says retrying cannot help: its job is quarantined
    ├── Stopped                a task stopped when asked, its checkpoint saved
    ├── FailpointError         a failpoint set to `error` fired
    └── Unhealthy              a loop has stopped moving, or has not started (exit 1)

The CLI maps ConfigError and InvalidInput to exit code 2, StaleFence to exit code 3 (a
heartbeat from an attempt that a newer one replaced), and every other CorralError to 1.
"""

from __future__ import annotations

from collections.abc import Sequence


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


class TemplateError(InvalidInput):
    """Raised when a placeholder of an HTTP job's spec names nothing in the job's payload."""


class Conflict(InvalidInput):
    """Raised when a request does not fit the state its target is in now (a retry of a job
    that is not quarantined, a resume of a schedule that is not paused)."""


class CountChanged(Conflict):
    """Raised when a bulk operation's filter matches another number of jobs than the
    person confirmed: nothing is made."""

    def __init__(self, count: int, expected: int) -> None:
        super().__init__(
            f"expect: the filter now matches {count} jobs, not {expected}; preview again"
        )
        self.count = count


# --- refusals: each says who refused what, so its answer can name it ---------------------


class Refused(CorralError):
    """Raised when corral says no to something it was asked, and says why."""


class RequestRefused(Refused):
    """Raised when the API refuses a request: it answers with `status` and a JSON body
    naming what is wrong."""

    def __init__(self, status: int, message: str, *, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.headers = headers


class NotGranted(Refused):
    """Raised when a tenant asks for what its grant does not give it (an executor): 403."""


class NeedSignIn(Refused):
    """Raised when a dashboard page is asked for without a valid session: to the sign-in
    page, which sends the person back to `back`."""

    def __init__(self, back: str) -> None:
        super().__init__(back)
        self.back = back


class Forbidden(Refused):
    """Raised when the dashboard session's role may not do what was asked, or a form came
    without the session's CSRF token: 403."""


class PageMissing(Refused):
    """Raised when a dashboard page is asked for what does not exist, or is another
    tenant's: 404, so that another tenant's objects cannot be told from none."""


class TooManyStreams(Refused):
    """Raised when a dashboard stream is asked for while the most one process serves are
    open: 429."""


class QuotaExceeded(Refused):
    """Raised when a tenant's write (a submit, a schedule made, a firing) would break one of
    its quotas (`[tenants.NAME]`): 403, naming the quota, the tenant and its limit."""

    def __init__(self, message: str, *, quota: str, tenant: str) -> None:
        super().__init__(message)
        self.quota, self.tenant = quota, tenant


class RateLimited(QuotaExceeded):
    """Raised when a tenant's submits came faster than its submit_rate: 429, with how many
    seconds to wait (`retry_after`, the Retry-After header) before enough tokens are back."""

    def __init__(self, message: str, *, quota: str, tenant: str, retry_after: int) -> None:
        super().__init__(message, quota=quota, tenant=tenant)
        self.retry_after = retry_after


class DestinationRefused(Refused):
    """Raised when the HTTP executor's guard refuses an address a request would go to."""


class FieldRefused(Refused):
    """Raised when a field of a cluster executor's spec breaks a rule. The field and the
    rule are kept apart, so that the executor words them for a job's spec (InvalidInput) or
    for a setting (ConfigError)."""

    def __init__(self, field: str, rule: str) -> None:
        super().__init__(f"{field}: {rule}")
        self.field, self.rule = field, rule


# --- the rest of the tree --------------------------------------------------------------------


class SignatureInvalid(CorralError):
    """Raised when a request said to come from corral does not carry a valid signature of
    its secret."""


class IllegalTransition(CorralError):
    """Raised when a state change is not in the transition table."""


class NotFound(CorralError):
    """Raised when a job or attempt does not exist."""


class StaleFence(CorralError):
    """Raised when an attempt that is no longer its job's current one reports in: it must stop."""


class StaleFenceError(StaleFence):
    """Raised by a sink in strict mode when a newer attempt has already written there."""

    def __init__(self, message: str, *, fence: int, newer: int) -> None:
        super().__init__(message)
        self.fence = fence
        self.newer = newer


class AuditFailed(CorralError):
    """Raised when a staged output fails an audit: nothing was published."""

    def __init__(self, dataset: str, problems: Sequence[str]) -> None:
        super().__init__(f"{dataset}: not published: " + "; ".join(problems))
        self.problems = list(problems)


class StoreError(CorralError):
    """Raised when the database fails or cannot be reached."""


class SchemaOutOfDate(StoreError):
    """Raised when the database schema is older than this corral: run `corral db upgrade`."""


class StoreUnavailable(StoreError):
    """Raised when the database server cannot be reached: a connection could not be made or
    was lost, or a call got no answer within timeouts.database_transaction_timeout. Trying
    again later may succeed (long-running commands wait for it at start)."""


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


class Undelivered(CorralError):
    """Raised when an alert channel's try did not deliver: why, in one line."""


class PermanentError(CorralError):
    """Raise it from a task when retrying cannot help: the job is quarantined at once.

    Its message is the task's own: raised bare, it has none, and the failure reads
    "PermanentError" rather than this text."""

    def __init__(self, *args: object) -> None:
        Exception.__init__(self, *args)


class Stopped(CorralError):
    """Raise it from a task that saw `ctx.stopping` and saved its checkpoint: at shutdown
    its job is handed back, not charged, to resume elsewhere; after a cancel, nothing is
    recorded (the cancel was). Returning normally instead counts as done.

    Its message is the task's own, as PermanentError's is."""

    def __init__(self, *args: object) -> None:
        Exception.__init__(self, *args)


class FailpointError(CorralError):
    """Raised by a failpoint set to `error`."""


class Unhealthy(CorralError):
    """Raised when a health file is missing, unreadable, or older than allowed."""
