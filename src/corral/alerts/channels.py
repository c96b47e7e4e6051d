"""Where messages go: e-mail over SMTP, a Slack incoming webhook, any webhook. Each
`send` either delivers or raises Undelivered, within the channel's timeout; web channels
go through the same guard as HTTP jobs. What a message says is `render`ed once for all."""

from __future__ import annotations

import asyncio
import email.message
import email.utils
import hashlib
import json
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol
from urllib.parse import quote

import httpx

from corral import alert_settings, config, errors, launching, redaction
from corral.executors import http_guard, http_outcome, http_request, http_send
from corral.store.alert_subjects import subject_parts
from corral.store.alerts import Alert


@dataclass(frozen=True, slots=True)
class Rendered:
    """What one message says, for every channel alike."""

    title: str
    lines: tuple[str, ...]
    link: str | None
    key: str  # the dedupe key: a receiver can spot a repeat by it
    body: Mapping[str, Any]  # the webhook's JSON body
    link_to: str = "job"  # what the link opens: the job, the schedule, the jobs

    @property
    def text(self) -> str:
        link = [f"{self.link_to.capitalize()}: {self.link}"] if self.link else []
        return "\n".join([*self.lines, *link, "", f"corral alert {self.key}"]) + "\n"


def _when(at: str | None) -> str:
    if not at:
        return "-"
    return datetime.fromisoformat(at).strftime("%Y-%m-%d %H:%M:%S UTC")


def _link(alert: Alert, base_url: str | None) -> tuple[str | None, str]:
    """The dashboard's page of what a message is about, under `base_url`, and what it is:
    a schedule's page, else the job's, else (a digest of several subjects) the jobs."""
    if not base_url or alert.kind == "test":
        return None, "job"
    ui = f"{base_url.rstrip('/')}/ui"
    kind, tenant, name = subject_parts(_one_subject(alert))
    if kind == "schedule" and tenant:
        return f"{ui}/schedules/{quote(tenant, safe='')}/{quote(name, safe='')}", "schedule"
    if kind == "monitor" and tenant:
        return f"{ui}/monitors/{quote(tenant, safe='')}/{quote(name, safe='')}", "monitor"
    if alert.job_id is not None:
        return f"{ui}/jobs/{alert.job_id}", "job"
    if kind == "job" and name.isdigit():
        return f"{ui}/jobs/{name}", "job"
    if kind == "schedule":
        return f"{ui}/schedules", "schedules"
    if kind == "queue":  # an older corral's message, read back from its history
        return f"{ui}/jobs?{urllib.parse.urlencode({'queue': name})}", "jobs"
    return f"{ui}/jobs", "jobs"


def _one_subject(alert: Alert) -> str:
    """The subject a message is about: a digest's one subject when it names one alone."""
    named = alert.details.get("subjects") if alert.kind == "digest" else None
    if isinstance(named, list) and len(named) == 1 and isinstance(named[0], str):
        return named[0]
    return alert.subject


def _about(subject: str) -> str:
    """A subject in words, its tenant aside: `schedule nightly`, `key invoice-42`,
    `job 12` (an older corral's: `queue billing`)."""
    kind, _, name = subject_parts(subject)
    return f"{kind} {name}"


def _tenant(alert: Alert) -> str:
    """Whose subject a message is about."""
    return str(alert.details.get("tenant") or subject_parts(alert.subject)[1] or "default")


def render(alert: Alert, base_url: str | None = None) -> Rendered:
    """The words of a message (pure): what happened, to which subject of which tenant,
    what the job runs, its last attempt's status or error, and a link to the subject's
    page under `base_url`."""
    title, lines = _words(alert, f"{_about(alert.subject)} of tenant {_tenant(alert)}")
    link, link_to = _link(alert, base_url)
    body = {
        "type": f"corral.alert.{alert.kind}",
        "key": alert.dedupe_key,
        "rule": alert.rule,
        "cause": alert.cause,
        "subject": alert.subject,
        "tenant": _tenant(alert),
        "job_id": alert.job_id,
        "title": title,
        "details": dict(alert.details),
        "link": link,
    }
    return Rendered(title, tuple(lines), link, alert.dedupe_key, body, link_to)


_Words = tuple[str, list[str]]
"""A message's title and its lines."""


def _words(alert: Alert, about: str) -> _Words:
    """What a message says, by its kind (a digest, a recovery, a test) and else its cause."""
    if alert.kind == "digest":
        return _digest(alert)
    if alert.kind == "recovered":
        title = f"[corral] recovered: {about} (job {alert.job_id} succeeded)"
        return title, [
            f"Rule {alert.rule}: {_about(alert.subject)} succeeded again after failures.",
            *_facts(alert, with_status=False),
        ]
    if alert.kind == "test":
        title = f"[corral] test message for channel {alert.channel}"
        return title, ["If you read this, corral can reach you here."]
    return _BY_CAUSE.get(alert.cause, _failed)(alert, about)


def _facts(alert: Alert, *, with_status: bool = True) -> list[str]:
    """What every message of a job says: its tenant and subject, the job and where it
    ran, what it runs, and its newest attempt's status or error."""
    d = alert.details
    job = [
        f"Job {alert.job_id}, queue {d.get('queue')}, executor {d.get('executor')}"
        if alert.job_id is not None
        else None,
        f"Runs: {d['what']}" if d.get("what") else None,
    ]
    status = d.get("attempt_reason") or d.get("reason")
    if with_status and d.get("attempt") and status:
        job.append(f"Attempt {d['attempt']}: {status}")
    return [
        f"Tenant: {_tenant(alert)}",
        f"Subject: {_about(alert.subject)}",
        *[line for line in job if line is not None],
    ]


def _digest(alert: Alert) -> _Words:
    """The news a rule's throttle held back of a tenant's subjects: how many, of which
    causes, the subjects and the jobs it names."""
    d = alert.details
    count = int(d.get("count", 0))
    causes = "/".join(d.get("causes", []))
    subjects = [_about(s) for s in d.get("subjects", [])]
    of = ", ".join(subjects) if subjects else _about(alert.subject)
    title = f"[corral] {count} more {causes} in {of} of tenant {_tenant(alert)}"
    title += f" since {_when(d.get('since'))}"
    named = [f"job {j}" for j in d.get("jobs", [])]
    rest = count - len(named)
    lines = [f"Rule {alert.rule} held back {count} of tenant {_tenant(alert)}."]
    if subjects:
        lines.append("Subjects: " + ", ".join(subjects))
    if named:
        lines.append("Jobs: " + ", ".join(named) + (f" and {rest} more" if rest > 0 else ""))
    return title, lines


def _streak(alert: Alert, about: str) -> _Words:
    d = alert.details
    title = f"[corral] {d.get('streak')} failures in a row in {about} (job {alert.job_id})"
    return title, [
        f"Rule {alert.rule}: {d.get('streak')} jobs in a row ended without succeeding.",
        *_facts(alert),
        f"The last: {d.get('failure_class') or 'no class'}: {d.get('reason')}",
        f"At: {_when(d.get('at'))}",
    ]


def _late(alert: Alert, about: str) -> _Words:
    d = alert.details
    late = float(d.get("late_seconds") or 0)
    title = f"[corral] {about}: a firing started {late:g}s late (job {alert.job_id})"
    return title, [
        f"Rule {alert.rule}: job {alert.job_id} started {late:g}s after its nominal time.",
        *_facts(alert, with_status=False),
        f"Started: {_when(d.get('at'))}",
    ]


def _not_run(alert: Alert, about: str) -> _Words:
    d = alert.details
    what = "were refused" if alert.cause in ("refused", "quota") else "did not run"
    title = f"[corral] {about}: nominal times {what}"
    return title, [
        f"Rule {alert.rule}: {d.get('reason')}",
        *_facts(alert, with_status=False),
        f"At: {_when(d.get('at'))}",
    ]


def _paused(alert: Alert, about: str) -> _Words:
    """A schedule corral paused: why, and how to resume it (in the event's reason)."""
    d = alert.details
    title = (
        f"[corral] schedule {d.get('schedule')} (tenant {d.get('tenant')}) paused: it kept failing"
    )
    return title, [f"Rule {alert.rule}: {d.get('reason')}", f"At: {_when(d.get('at'))}"]


def _failed(alert: Alert, about: str) -> _Words:
    """A job's own news (failed, quarantined, ...): the job, where it ran, and why."""
    d = alert.details
    title = f"[corral] {alert.cause}: {about}" + (
        f" (job {alert.job_id})" if not alert.subject.startswith("job:") else ""
    )
    return title, [
        f"Rule {alert.rule}: {alert.cause}.",
        *_facts(alert),
        f"Last attempt: {d.get('failure_class') or 'no class'}: {d.get('reason')}",
        f"At: {_when(d.get('at'))}",
    ]


_MONITOR = {
    "monitor_down": "is down",
    "monitor_failed": "failed",
    "monitor_up": "is up again",
}


def _monitor(alert: Alert, about: str) -> _Words:
    """A monitor gone down, failed or back up: what its last ping (or its silence) says."""
    d = alert.details
    title = f"[corral] monitor {d.get('monitor')} (tenant {_tenant(alert)}) {_MONITOR[alert.cause]}"
    return title, [
        f"Rule {alert.rule}: {d.get('reason')}",
        f"Tenant: {_tenant(alert)}",
        f"At: {_when(d.get('at'))}",
    ]


_BY_CAUSE: Mapping[str, Callable[[Alert, str], _Words]] = {
    "consecutive_failures": _streak,
    "schedule_late": _late,
    "schedule_missed": _not_run,
    "refused": _not_run,
    "quota": _not_run,
    "paused": _paused,
    **dict.fromkeys(_MONITOR, _monitor),
}
"""The words of the causes that say more than a job's failure."""


class Channel(Protocol):
    async def send(self, message: Rendered) -> None: ...


class Email:
    """SMTP with aiosmtplib: smtps:// is TLS from the start, `starttls` upgrades smtp://,
    user:password@ logs in. The dedupe key is the Message-ID."""

    def __init__(self, settings: alert_settings.EmailChannel) -> None:
        self.settings = settings
        url = urllib.parse.urlsplit(settings.smtp_url)
        self.tls = url.scheme == "smtps"
        self.host = url.hostname or "localhost"
        self.port = url.port or (465 if self.tls else 25)
        self.user = urllib.parse.unquote(url.username) if url.username else None
        self.password = urllib.parse.unquote(url.password) if url.password else None

    async def send(self, message: Rendered) -> None:
        import aiosmtplib

        mail = email.message.EmailMessage()
        mail["From"] = self.settings.sender
        mail["To"] = ", ".join(self.settings.to)
        mail["Subject"] = message.title
        mail["Message-ID"] = f"<{hashlib.sha256(message.key.encode()).hexdigest()[:32]}@corral>"
        mail["Date"] = email.utils.formatdate(usegmt=True)
        mail.set_content(message.text)
        try:
            await aiosmtplib.send(
                mail,
                hostname=self.host,
                port=self.port,
                username=self.user,
                password=self.password,
                use_tls=self.tls,
                start_tls=False if self.tls else self.settings.starttls,
                timeout=self.settings.timeout.total_seconds(),
            )
        except (aiosmtplib.SMTPException, OSError, TimeoutError) as exc:
            raise errors.Undelivered(f"{type(exc).__name__}: {exc}") from None


class _Web:
    """A POST of JSON through the HTTP jobs' guard, to the address it checked."""

    def __init__(self, url: str, seconds: float, guard: http_guard.Guard) -> None:
        self.url = url
        self.seconds = seconds
        self.guard = guard
        self.clients: dict[str, httpx.AsyncClient] = {}

    def _client(self, origin: str) -> httpx.AsyncClient:
        if origin not in self.clients:
            self.clients[origin] = httpx.AsyncClient(follow_redirects=False, trust_env=False)
        return self.clients[origin]

    async def post(self, body: Mapping[str, Any], headers: Mapping[str, str]) -> None:
        outcome = await http_send.send(
            self._client,
            self.guard,
            method="POST",
            url=self.url,
            headers={"Content-Type": "application/json", "User-Agent": "corral", **headers},
            content=json.dumps(body).encode(),
            seconds=self.seconds,
            body_bytes=1024,
        )
        phase, reason, _ = http_outcome.judge(outcome, ["2xx"])
        if phase is not launching.Phase.SUCCEEDED:
            raise errors.Undelivered(
                redaction.redacted(reason).replace(self.url, "[the channel's URL]")
            )

    async def close(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self.clients.values()))


class Slack(_Web):
    """A Slack incoming webhook: a Block Kit message (what happened, the job, its last
    attempt, a link), with the dedupe key in its text."""

    def __init__(self, settings: alert_settings.SlackChannel, guard: http_guard.Guard) -> None:
        super().__init__(settings.webhook_url, settings.timeout.total_seconds(), guard)

    async def send(self, message: Rendered) -> None:
        await self.post(slack_body(message), {})


def slack_body(message: Rendered) -> dict[str, Any]:
    """The Block Kit message (pure)."""
    from slack_sdk.models.blocks import (
        ContextBlock,
        HeaderBlock,
        MarkdownTextObject,
        SectionBlock,
    )

    blocks = [
        HeaderBlock(text=message.title[:150]),
        SectionBlock(text=MarkdownTextObject(text="\n".join(message.lines)[:3000])),
    ]
    if message.link:
        opens = f"<{message.link}|Open the {message.link_to}>"
        blocks.append(SectionBlock(text=MarkdownTextObject(text=opens)))
    blocks.append(ContextBlock(elements=[MarkdownTextObject(text=f"corral alert `{message.key}`")]))
    return {
        "text": f"{message.title} ({message.key})",
        "blocks": [b.to_dict() for b in blocks],
    }


class Webhook(_Web):
    """Any URL: the documented JSON body (`Rendered.body`), signed the Standard Webhooks
    way when the channel has a secret (webhook-id: the dedupe key)."""

    def __init__(
        self, settings: alert_settings.WebhookChannel, guard: http_guard.Guard, now: Any
    ) -> None:
        super().__init__(settings.url, settings.timeout.total_seconds(), guard)
        self.secret = settings.secret
        self.now = now

    async def send(self, message: Rendered) -> None:
        headers = {"Idempotency-Key": message.key}
        if self.secret:
            http_request.sign(headers, json.dumps(message.body).encode(), [self.secret], self.now())
        await self.post(message.body, headers)


def build(name: str, settings: config.Settings, now: Any) -> Email | Slack | Webhook:
    """The channel `name` of the settings, ready to send."""
    return made(settings.alerts.channels[name], settings, now)


def made(
    channel: alert_settings.EmailChannel
    | alert_settings.SlackChannel
    | alert_settings.WebhookChannel,
    settings: config.Settings,
    now: Any,
) -> Email | Slack | Webhook:
    """`channel` (of the settings, or a tenant's) ready to send: a web one through the
    HTTP jobs' guard, at every send."""
    guard = http_guard.Guard(settings.executors.http.allow_networks)
    if isinstance(channel, alert_settings.EmailChannel):
        return Email(channel)
    if isinstance(channel, alert_settings.SlackChannel):
        return Slack(channel, guard)
    return Webhook(channel, guard, now)
