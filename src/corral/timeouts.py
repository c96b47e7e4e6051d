"""The chain of time limits: `Timeouts`, and the rule that every inner limit stays shorter
than the one around it (DESIGN.md, "Configuration").

`CHAIN` lists each link with why it must hold; `chain` measures a configuration against
it (what `corral check` prints) and `chain_violations` says what is broken, for the
settings at start-up, for a job's own tighter limits, and for
`corral.testing.assert_timeouts_nest` in a user's CI. An inner limit left unset follows
its outer one down (`tighten_inner`), so setting one limit never breaks the chain.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from corral import durations

if TYPE_CHECKING:  # the chain reads a Settings, which holds a Timeouts
    from corral import config

_INNER: tuple[tuple[str, str, str | None, str | None], ...] = (
    ("attempt_deadline", "step_deadline", "margin", None),
    ("step_deadline", "http_request_timeout", "margin", None),
    ("lease_timeout", "heartbeat_interval", "margin", None),
    ("attempt_deadline", "drain_timeout", "margin", None),
    ("dispatch_interval", "tick_deadline", "tick_margin", None),
    ("launch_grace", "tick_deadline", "tick_margin", None),
    ("launch_grace", "database_transaction_timeout", "tick_margin", "tick_deadline"),
    ("lease_timeout", "database_transaction_timeout", None, None),
    ("database_transaction_timeout", "database_statement_timeout", "tick_margin", None),
    ("database_statement_timeout", "database_lock_timeout", "tick_margin", None),
    ("database_transaction_timeout", "database_idle_timeout", "tick_margin", None),
    ("database_transaction_timeout", "database_tcp_timeout", "tick_margin", None),
    ("database_transaction_timeout", "database_connect_timeout", "tick_margin", None),
)
"""(outer, inner, margin, extra): an inner limit left unset is tightened with its outer one,
to at most outer - margin - extra (a margin of None: no margin). In this order, so that a
limit that follows is itself followed."""

_WHOLE_SECONDS = {"database_connect_timeout": 2}
"""Limits libpq counts in whole seconds, and the least each may be: one that follows its
outer limit down is rounded down to whole seconds, and stops at that least."""


def tighten_inner(
    limits: Mapping[str, timedelta], given: set[str], *, for_job: bool = False
) -> dict[str, timedelta]:
    """`limits` (every time limit by name) with each inner limit not in `given` shortened,
    where it must be, to its outer limit less the margin (never below 1ms). `for_job`: the
    limits are a job's own, whose margin may shrink with them (see `job_margin`)."""
    out = dict(limits)
    for outer, inner, margin, extra in _INNER:
        spare = out[margin] if margin else timedelta(0)
        if for_job and margin:
            spare = job_margin(spare, out[outer])
        room = out[outer] - spare - (out[extra] if extra else timedelta(0))
        least = timedelta(seconds=durations.MIN_DURATION)
        if inner in _WHOLE_SECONDS:
            room = timedelta(seconds=room // timedelta(seconds=1))
            least = timedelta(seconds=_WHOLE_SECONDS[inner])
        if inner not in given and out[inner] > room >= least:
            out[inner] = room
    return out


def job_margin(margin: timedelta, outer: timedelta) -> timedelta:
    """The margin inside a job's own limit: the deployment's margin, or half the limit when
    that is shorter than twice the margin. So a job with a 5s deadline gets 2.5s steps and
    1.25s requests: short jobs can have short limits, and they still nest."""
    return min(margin, outer / 2)


class Timeouts(BaseModel):
    """Time limits. Each inner limit is shorter than the one around it (see DESIGN.md).

    An inner limit left unset follows its outer one down: set only attempt_deadline to 90s
    and step_deadline becomes 85s (with the 5s margin) instead of refusing its default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _unset_inner_limits_follow(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        try:
            given = {
                k: durations.parse_duration(v) for k, v in data.items() if k in cls.model_fields
            }
        except ValueError:
            return data  # field validation names the bad value
        defaults = {k: f.default for k, f in cls.model_fields.items()}
        return {**data, **tighten_inner({**defaults, **given}, set(given))}

    attempt_deadline: durations.Duration = Field(
        timedelta(seconds=240), description="An attempt is stopped after this long."
    )
    recovery_grace: durations.Duration = Field(
        timedelta(seconds=360),
        description="After this long without a platform object, an attempt counts as lost.",
    )
    launch_grace: durations.Duration = Field(
        timedelta(seconds=30),
        description="A launching attempt older than this is checked by recovery.",
    )
    lease_timeout: durations.Duration = Field(
        timedelta(seconds=60),
        description="A running attempt without news (observation, heartbeat) this long is checked.",
    )
    reconcile_interval: durations.Duration = Field(
        timedelta(seconds=10), description="How often the reconciler makes a pass."
    )
    operation_interval: durations.Duration = Field(
        timedelta(seconds=1),
        description="How often each serve and api process looks for bulk operations to run"
        " (at once again while one has items left).",
    )
    margin: durations.Duration = Field(
        timedelta(seconds=5),
        description="How much shorter an inner time limit must be than the one around it.",
    )
    cancel_grace: durations.Duration = Field(
        timedelta(seconds=10),
        description="Time between the polite stop (SIGTERM) and the forced one (SIGKILL).",
    )
    dispatch_interval: durations.Duration = Field(
        timedelta(seconds=1),
        description="A tick starts this often (start to start); at once while there is more.",
    )
    observe_interval: durations.Duration = Field(
        timedelta(seconds=2), description="How often the dispatcher polls running attempts."
    )
    tick_deadline: durations.Duration = Field(
        timedelta(milliseconds=500),
        description="A tick starts no new launch after this long; the rest go first next tick.",
    )
    tick_margin: durations.Duration = Field(
        timedelta(milliseconds=100),
        description="The margin for the links between short limits: the tick's and the database's.",
    )
    heartbeat_interval: durations.Duration = Field(
        timedelta(seconds=20),
        description="How often a job that sends heartbeats sends one (CORRAL_HEARTBEAT_INTERVAL),"
        " and how often each corral process beats in the loops table (three missed: stale).",
    )
    step_deadline: durations.Duration = Field(
        timedelta(seconds=120), description="The longest one step of an attempt may take."
    )
    drain_timeout: durations.Duration = Field(
        timedelta(seconds=30),
        description="After SIGTERM, how long a `corral worker` lets its running tasks finish"
        " before it asks them to checkpoint and hands them back (the pod's"
        " terminationGracePeriodSeconds must exceed it by the margin).",
    )
    http_request_timeout: durations.Duration = Field(
        timedelta(seconds=30), description="The longest one HTTP request of a step may take."
    )
    database_wait: durations.Duration = Field(
        timedelta(minutes=5),
        description="At start, how long serve, dispatcher and reconciler keep trying to reach"
        " a database that cannot be reached (with growing pauses) before they give up.",
    )
    database_connect_timeout: durations.Duration = Field(
        timedelta(seconds=5),
        description="PostgreSQL: the longest making one connection may take (libpq's"
        " connect_timeout, in whole seconds, at least 2).",
    )
    database_tcp_timeout: durations.Duration = Field(
        timedelta(seconds=10),
        description="PostgreSQL: a connection whose other end stays silent this long is"
        " dropped, on corral's side and on the server's (TCP keepalives, tcp_user_timeout),"
        " so the server ends a cut client's transaction and frees its row locks.",
    )
    database_lock_timeout: durations.Duration = Field(
        timedelta(seconds=2),
        description="PostgreSQL: the longest a statement waits for a lock (lock_timeout);"
        " then it fails, and the work is tried again.",
    )
    database_statement_timeout: durations.Duration = Field(
        timedelta(seconds=10),
        description="PostgreSQL: the longest one statement may run (statement_timeout).",
    )
    database_idle_timeout: durations.Duration = Field(
        timedelta(seconds=10),
        description="PostgreSQL: the server ends a session that stays idle this long inside"
        " a transaction (idle_in_transaction_session_timeout), releasing its locks.",
    )
    database_transaction_timeout: durations.Duration = Field(
        timedelta(seconds=20),
        description="PostgreSQL: corral gives up one call to the store (a transaction,"
        " connecting included) after this long without an answer; the backstop for when"
        " the network is gone and the server's own limits cannot say so.",
    )

    @field_validator(*_WHOLE_SECONDS)
    @classmethod
    def _whole_seconds(cls, value: timedelta, info: ValidationInfo) -> timedelta:
        seconds, least = value.total_seconds(), _WHOLE_SECONDS[str(info.field_name)]
        if seconds < least or seconds != int(seconds):
            raise ValueError(f"{seconds:g}s: libpq counts it in whole seconds, at least {least}")
        return value


@dataclass(frozen=True, slots=True)
class Link:
    """One relation of the chain: `inner` (plus `extra`) must stay below `outer`.

    A strict link needs at least the setting named by `margin` to spare; a loose one
    (margin None) only `<=`. A `postgres_only` link is about corral's own connections to
    PostgreSQL: it is checked only when database_url is a PostgreSQL one (SQLite uses none
    of those limits), and always with corral's own settings (a job's tighter limits do not
    make corral's transactions any shorter). A `cluster_only` link is about pods: checked
    only when an enabled executor runs its attempts in containers (kubernetes, argo: see
    ExecutorSettings.pods).
    """

    inner: str
    outer: str
    why: str
    margin: str | None = "timeouts.margin"
    extra: str | None = None
    postgres_only: bool = False
    deployment_only: bool = False  # about corral's own processes: a job's limits do not apply
    cluster_only: bool = False  # about pods: checked only when an executor makes pods


CHAIN = (
    Link(
        "timeouts.http_request_timeout",
        "timeouts.step_deadline",
        why="a step must outlive the requests it makes, or it fails where a request would",
    ),
    Link(
        "timeouts.step_deadline",
        "timeouts.attempt_deadline",
        why="an attempt must outlive its longest step",
    ),
    Link(
        "timeouts.attempt_deadline",
        "timeouts.recovery_grace",
        extra="timeouts.cancel_grace",
        why="an attempt still being stopped at its deadline must not be taken for lost"
        " and launched a second time",
    ),
    Link(
        "timeouts.attempt_deadline",
        "timeouts.recovery_grace",
        extra="executors.kubernetes.termination_grace",
        cluster_only=True,
        why="a pod stopped at its deadline runs on for its termination grace: it must have"
        " ended before recovery may take its attempt for lost and run the job beside it",
    ),
    Link(
        "executors.kubernetes.pod_start_timeout",
        "timeouts.attempt_deadline",
        deployment_only=True,
        why="a pod that never starts must fail with the reason it waits for, not as an"
        " attempt past its deadline (a job's shorter deadline shortens it for that job)",
    ),
    Link(
        "timeouts.drain_timeout",
        "timeouts.attempt_deadline",
        deployment_only=True,
        why="a worker stopping must hand its tasks back before their attempts' deadline, or"
        " recovery stops them as timed out and charges an attempt for a rollout",
    ),
    Link(
        "timeouts.heartbeat_interval",
        "timeouts.lease_timeout",
        why="a lease must outlast the gap between two heartbeats, or a healthy job looks silent",
    ),
    Link(
        "timeouts.lease_timeout",
        "timeouts.recovery_grace",
        margin=None,
        why="recovery must look at a quiet attempt before it may call it lost",
    ),
    Link(
        "timeouts.tick_deadline",
        "timeouts.dispatch_interval",
        margin="timeouts.tick_margin",
        why="a tick must end before the next one is due",
    ),
    Link(
        "timeouts.tick_deadline",
        "timeouts.launch_grace",
        margin="timeouts.tick_margin",
        why="recovery must not take an attempt for stuck while its own tick is launching it",
    ),
    Link(
        "timeouts.recovery_grace",
        "executors.process.retention",
        why="a finished run must stay until recovery has read how it ended",
    ),
    Link(
        "timeouts.recovery_grace",
        "executors.kubernetes.ttl_after_finished",
        why="a finished Kubernetes Job must outlive a corral outage, or its outcome is deleted"
        " before recovery can read it",
    ),
    Link(
        "claim_batch_limit",
        "recovery_batch_limit",
        extra="claim_batch_limit",
        margin=None,
        why="one reconciler pass must be able to repair every attempt of a tick that failed"
        " half-way, and of the next tick's claim, made while that tick launched",
    ),
    Link(
        "timeouts.database_lock_timeout",
        "timeouts.database_statement_timeout",
        margin="timeouts.tick_margin",
        postgres_only=True,
        why="a statement kept waiting for a lock must fail as a lock wait, which says what"
        " held it up, before it fails as a slow statement",
    ),
    Link(
        "timeouts.database_statement_timeout",
        "timeouts.database_transaction_timeout",
        margin="timeouts.tick_margin",
        postgres_only=True,
        why="the server must stop a slow statement, and say why, before corral gives up"
        " waiting for its answer",
    ),
    Link(
        "timeouts.database_connect_timeout",
        "timeouts.database_transaction_timeout",
        margin="timeouts.tick_margin",
        postgres_only=True,
        why="connecting is part of a call to the store: a server that cannot be reached must"
        " fail as such before the call is given up",
    ),
    Link(
        "timeouts.database_tcp_timeout",
        "timeouts.database_transaction_timeout",
        margin="timeouts.tick_margin",
        postgres_only=True,
        why="a connection cut in the middle of a call must be found dead, freeing the thread"
        " that waits on it, before the call is given up; or given-up calls pile up in the"
        " store's threads",
    ),
    Link(
        "timeouts.database_idle_timeout",
        "timeouts.database_transaction_timeout",
        margin="timeouts.tick_margin",
        postgres_only=True,
        why="the server must end the transaction of a client gone silent, and free its row"
        " locks, before that client gives the call up and tries again behind those locks",
    ),
    Link(
        "timeouts.database_transaction_timeout",
        "timeouts.launch_grace",
        extra="timeouts.tick_deadline",
        margin="timeouts.tick_margin",
        postgres_only=True,
        why="a claim whose answer comes late must be given up, or its attempts launched,"
        " before recovery looks at them",
    ),
    Link(
        "timeouts.database_transaction_timeout",
        "timeouts.lease_timeout",
        margin=None,
        postgres_only=True,
        why="a write that renews a lease must end, or be given up, within the lease",
    ),
)

JOB_LIMITS = (
    "http_request_timeout",
    "step_deadline",
    "attempt_deadline",
    "heartbeat_interval",
    "lease_timeout",
)
"""The time limits a job may tighten for itself (never loosen)."""


@dataclass(frozen=True, slots=True)
class LinkCheck:
    """A link of the chain with this configuration's values, in whole units (microseconds
    for durations, so that a limit that meets the rule exactly is not refused by rounding)."""

    link: Link
    inner: int
    extra: int
    outer: int
    needed: int  # the margin for a strict link, else 0
    applies: bool = True  # False: a PostgreSQL link, on SQLite

    @property
    def spare(self) -> int:
        return self.outer - self.inner - self.extra

    @property
    def ok(self) -> bool:
        return self.spare >= self.needed

    def show(self, units: int) -> str:
        """`units` as a person reads them: seconds for time limits, counts otherwise."""
        if "timeouts." in (self.link.inner[:9], self.link.outer[:9]):
            return f"{units / 1_000_000:g}s"
        return f"{units:g}"


def chain(
    settings: config.Settings,
    limits: Mapping[str, timedelta] | None = None,
    *,
    for_job: bool = False,
) -> list[LinkCheck]:
    """Every link of the chain, with this configuration's values; `limits` replaces some
    time limits (a job's own, by name without `timeouts.`) in all but PostgreSQL links.
    `for_job`: a link whose outer limit is one a job sets needs only the job's margin
    (`job_margin`)."""
    replaced = {f"timeouts.{name}": value for name, value in (limits or {}).items()}
    postgres = not settings.database_url.startswith("sqlite:")
    cluster = settings.executors.pods

    def check(link: Link) -> LinkCheck:
        def value(dotted: str) -> Any:
            if dotted in replaced and not (link.postgres_only or link.deployment_only):
                return replaced[dotted]
            return _get(settings, dotted)

        def needed() -> int:
            if link.margin is None:
                return 0
            margin = value(link.margin)
            job_outer = link.outer.removeprefix("timeouts.") in JOB_LIMITS
            if for_job and job_outer and not link.postgres_only:
                margin = job_margin(margin, value(link.outer))
            return _units(margin)

        return LinkCheck(
            link,
            inner=_units(value(link.inner)),
            extra=_units(value(link.extra)) if link.extra else 0,
            outer=_units(value(link.outer)),
            needed=needed(),
            applies=(postgres or not link.postgres_only) and (cluster or not link.cluster_only),
        )

    return [check(link) for link in CHAIN]


def chain_violations(
    settings: config.Settings,
    limits: Mapping[str, timedelta] | None = None,
    *,
    for_job: bool = False,
) -> list[str]:
    """One message per broken link, naming both settings, their values and the margin."""
    out = []
    for c in chain(settings, limits, for_job=for_job):
        if c.ok or not c.applies:
            continue
        link = c.link
        inner = f"{link.inner} ({c.show(c.inner)})"
        if link.extra:
            inner += f" + {link.extra} ({c.show(c.extra)})"
        rule = (
            f"at least {c.show(c.needed)} ({link.margin}) less than" if link.margin else "at most"
        )
        out.append(f"{inner} must be {rule} {link.outer} ({c.show(c.outer)}): {link.why}")
    return out


_FOLLOWING = {"executors.kubernetes.pod_start_timeout": "pod_start_timeout"}
"""Settings that, unset, follow another limit: the Settings property of their value."""


def _get(settings: config.Settings, dotted: str) -> Any:
    if dotted in _FOLLOWING:
        return getattr(settings, _FOLLOWING[dotted])
    value: Any = settings
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def _units(value: Any) -> int:
    return value // timedelta(microseconds=1) if isinstance(value, timedelta) else int(value)
