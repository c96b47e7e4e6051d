"""Alert settings as corral.toml writes them: channels (`[alerts.channels.NAME]`), rules
(`[alerts.rules.NAME]`) and their throttles.

Apart from corral.alerts, which sends the messages: the settings are read at every
start-up, and reading them must not import the SMTP, Slack and HTTP clients.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from corral import durations

ALERT_CAUSES = (
    "quarantined",
    "failed",
    "lost",
    "unknown",
    "budget_empty",
    "schedule_late",
    "schedule_missed",
    "sla_missed",
    "consecutive_failures",
    "refused",
    "quota",
    "paused",
    "monitor_down",
    "monitor_failed",
    "monitor_up",
)
"""What a rule may fire `on`: a job quarantined or failed for good, an attempt lost or of
unknown class, a retry waiting for an empty budget, a firing late or missed, a job past
its SLA, `after` failures in a row of one subject (a schedule, a key or a job), a
tenant's schedule's firing refused (its tenant no longer granted its executor), one
refused because it would break a quota of its tenant (max_queued, submit_rate), and a
schedule corral paused after its `pause_after` failed firings in a row (corral.autopause);
a monitor gone down (no ping by its grace's end), failed (a failure ping) or back up
(corral.monitoring)."""

STREAK = 3
"""consecutive_failures' `after` when a rule does not set it."""

_EMAIL = re.compile(r"^[^@\s<>]+@[^@\s<>]+\.[^@\s<>]+$|^[^@\s<>]+@localhost$")


def _web_url(url: str) -> str:
    if not re.match(r"^https?://[^/\s]+", url):  # not echoed: it may hold a secret
        raise ValueError("must be an http:// or https:// URL")
    return url


def _smtp_url(url: str) -> str:
    if not re.match(r"^smtps?://([^@/\s]+@)?[^@/:\s]+(:\d+)?/?$", url):
        raise ValueError(f"{_shown_url(url)!r} is not smtp://[user:password@]HOST[:PORT]")
    return url


def email_address(address: str) -> str:
    """`address`, when it is an e-mail address; ValueError saying so if not."""
    if not _EMAIL.match(address):
        raise ValueError(f"{address!r} is not an e-mail address")
    return address


class EmailChannel(BaseModel):
    """Alerts as e-mail, over SMTP (aiosmtplib)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    kind: Literal["email"] = Field(description="email")
    smtp_url: str = Field(
        description="smtp://HOST:PORT or smtps://HOST:PORT (TLS from the start);"
        " user:password@ to log in."
    )
    sender: str = Field(alias="from", description="The From address.")
    to: tuple[str, ...] = Field(min_length=1, description="Who gets the messages.")
    starttls: bool | None = Field(
        None,
        description="smtp://: upgrade with STARTTLS before sending; unset, when the server"
        " offers it; false, never (then a password crosses in the clear).",
    )
    timeout: durations.Duration = Field(
        timedelta(seconds=30), description="Most one delivery may take."
    )

    @field_validator("smtp_url")
    @classmethod
    def _smtp(cls, url: str) -> str:
        return _smtp_url(url)

    @field_validator("sender")
    @classmethod
    def _sender(cls, address: str) -> str:
        return email_address(address)

    @field_validator("to")
    @classmethod
    def _to(cls, addresses: tuple[str, ...]) -> tuple[str, ...]:
        if bad := [a for a in addresses if not _EMAIL.match(a)]:
            raise ValueError(f"{bad[0]!r} is not an e-mail address")
        return addresses


class SlackChannel(BaseModel):
    """Alerts to a Slack incoming webhook, as Block Kit messages."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["slack"] = Field(description="slack")
    webhook_url: str = Field(description="The incoming webhook's URL (a secret: never shown).")
    timeout: durations.Duration = Field(
        timedelta(seconds=30), description="Most one delivery may take."
    )

    @field_validator("webhook_url")
    @classmethod
    def _url(cls, url: str) -> str:
        return _web_url(url)


class WebhookChannel(BaseModel):
    """Alerts as a JSON POST to any URL, signed like HTTP jobs (Standard Webhooks)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["webhook"] = Field(description="webhook")
    url: str = Field(description="Where the alert is POSTed.")
    secret: str | None = Field(
        None, description="whsec_... signing secret; unsigned without one. Never shown."
    )
    timeout: durations.Duration = Field(
        timedelta(seconds=30), description="Most one delivery may take."
    )

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        return _web_url(url)


AlertChannel = Annotated[EmailChannel | SlackChannel | WebhookChannel, Field(discriminator="kind")]


class AlertMatch(BaseModel):
    """Which jobs a rule is about; every key given must match."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    queue: str | None = Field(None, description="Only jobs of this queue.")
    schedule: str | None = Field(None, description="Only the jobs of this schedule's firings.")
    tenant: str | None = Field(None, description="Only jobs of this tenant.")
    executor: str | None = Field(None, description="Only jobs of this executor.")
    monitor: str | None = Field(
        None, description="Only this monitor's news (monitor_down, monitor_failed, monitor_up)."
    )
    labels: dict[str, str] = Field(
        default_factory=dict, description="Only jobs with each of these labels, so valued."
    )


class AlertRule(BaseModel):
    """When to tell whom: `on` these causes, for jobs that `match`, through `channels`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    on: tuple[Literal[ALERT_CAUSES], ...] = Field(  # type: ignore[valid-type]
        min_length=1, description="The causes it fires on (see the Alerts guide)."
    )
    match: AlertMatch = Field(AlertMatch(), description="Which jobs it is about.")
    channels: tuple[str, ...] = Field(min_length=1, description="Where its messages go.")
    throttle: durations.Duration = Field(
        timedelta(minutes=10),
        description="Per subject (the schedule, else the idempotency key, else the job), one"
        " message a window; the rest of the tenant's go in one digest a window.",
    )
    after: int | None = Field(
        None,
        ge=1,
        description="How many in a row of the same subject before a message:"
        " consecutive_failures' streak (3 unless set), every other cause's (1 unless set).",
    )
    late_by: durations.Duration = Field(
        timedelta(minutes=2),
        description="schedule_late: how long after its nominal time a firing's job may start.",
    )

    def in_a_row(self, cause: str) -> int:
        """How many of `cause` in a row of one subject make a message: `after`, else 3
        for consecutive_failures and 1 for any other cause."""
        if self.after is not None:
            return self.after
        return STREAK if cause == "consecutive_failures" else 1


class TenantSmtp(BaseModel):
    """The SMTP server tenants' e-mail channels send through: the operator's, as tenants
    give only addresses (`[alerts.tenant_smtp]`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    url: str = Field(description="smtp://HOST:PORT or smtps://HOST:PORT; user:password@ to log in.")
    sender: str = Field(alias="from", description="The From address of tenants' e-mail.")
    starttls: bool | None = Field(None, description="As an e-mail channel's `starttls`.")

    @field_validator("url")
    @classmethod
    def _smtp(cls, url: str) -> str:
        return _smtp_url(url)

    @field_validator("sender")
    @classmethod
    def _sender(cls, address: str) -> str:
        return email_address(address)

    def channel(self, to: tuple[str, ...]) -> EmailChannel:
        """A tenant's e-mail channel to `to`, through this server."""
        return EmailChannel(
            kind="email", smtp_url=self.url, sender=self.sender, to=to, starttls=self.starttls
        )


TENANT_PREFIX = "tenant:"
"""How the outbox, the history and mutes name a tenant's rule or channel:
`tenant:TENANT/NAME`, which no name of the settings may take."""


class AlertsSettings(BaseModel):
    """Who is told what went wrong (`[alerts.channels.NAME]`, `[alerts.rules.NAME]`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    channels: dict[str, AlertChannel] = Field(
        default_factory=dict,
        description="Where messages go, by name: `kind` email (smtp_url, from, to, starttls),"
        " slack (webhook_url) or webhook (url, secret).",
    )
    rules: dict[str, AlertRule] = Field(
        default_factory=dict,
        description="When to tell whom, by name: `on` (causes), `match` (queue, schedule,"
        " tenant, executor, labels), `channels`, `throttle`.",
    )
    base_url: str | None = Field(
        None,
        description="Deprecated: set public_url instead. corral's web address, which"
        " messages link under when public_url is not set.",
    )
    heartbeat_url: str | None = Field(
        None,
        description="Pinged (GET) after every reconciler pass: a dead man's switch for an"
        " outside monitor.",
    )

    tenant_smtp: TenantSmtp | None = Field(
        None,
        description="The SMTP server (url, from) tenants' e-mail channels send through;"
        " unset, tenants cannot make e-mail channels.",
    )

    @field_validator("base_url", "heartbeat_url")
    @classmethod
    def _urls(cls, url: str | None) -> str | None:
        return None if url is None else _web_url(url)

    @model_validator(mode="after")
    def _known_channels(self) -> AlertsSettings:
        for kind, names in (("channels", self.channels), ("rules", self.rules)):
            if taken := [n for n in names if n.startswith(TENANT_PREFIX)]:
                raise ValueError(f"{kind}.{taken[0]}: {TENANT_PREFIX!r} begins tenants' names")
        for name, rule in self.rules.items():
            if unknown := [c for c in rule.channels if c not in self.channels]:
                known = ", ".join(sorted(self.channels)) or "none"
                raise ValueError(
                    f"rules.{name}.channels: unknown channel {unknown[0]!r}; defined: {known}"
                )
        return self


def _shown_url(url: str) -> str:
    """A URL with its password hidden, for an error message."""
    return re.sub(r"://([^:@/]+):[^@/]*@", r"://\1:[redacted]@", url)
