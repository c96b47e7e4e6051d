"""What an alert is about: the job's schedule, else its idempotency key, else the job.
End to end on both databases, with a real SMTP server (aiosmtpd) and a real HTTP
receiver standing in for Slack: one message per subject and channel, a recovery only
from that subject's own success, digests per tenant and rule, `after` on any cause, and
the words a person needs to act (with nothing secret in them)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from corral import alert_settings, alerts, model, store
from corral.alerts import rules
from corral.store import Finish
from corral.testing import FrozenClock
from tests.integration import test_alerts as base
from tests.integration.test_alerts import (
    Web,
    firing,
    listening,
    quarantine,
    settings,
    succeed,
)
from tests.support.mail import Inbox

web_receiver = base.web_receiver

A, J = model.AttemptState, model.JobState
SECRET_URL = "https://ada:pw@hooks.example/ping?token=s3cret&n=1"
SHOWN_URL = "https://[redacted]@hooks.example/ping?token=[redacted]&n=1"
STATUS = "HTTP 503 Service Unavailable: upstream down"


async def fail_http(
    db: store.Store, clock: FrozenClock, *, tenant: str = "default", schedule: str | None = None
) -> int:
    """An HTTP job (a firing's of `schedule` when given) whose endpoint answers 503 for
    good: quarantined at its first attempt."""
    job = model.NewJob(
        executor="http",
        spec={"method": "post", "url": SECRET_URL},
        queue="billing",
        tenant=tenant,
        payload=firing(schedule, clock),
    )
    [(job_id, _)] = await db.jobs.submit(new=[job], now=clock.now())
    [c] = await db.jobs.claim(now=clock.now(), limit=1, executors=["http"])
    failed = Finish(c.attempt.id, A.FAILED, None, STATUS, model.FailureClass.PERMANENT)
    await db.attempts.finish(finishes=[failed], now=clock.now())
    return job_id


async def pass_(alerter: alerts.Alerter) -> None:
    await alerter.read_once()
    await alerter.deliver_all()


def slack_posts(web: Web) -> list[dict[str, Any]]:
    return [json.loads(s["body"]) for s in web.seen if s["path"] == "/slack"]


async def test_a_schedule_s_quarantine_is_one_message_a_channel_and_only_its_success_recovers(
    db: store.Store, smtp: tuple[Inbox, int], web_receiver: Web
) -> None:
    """One quarantine of a schedule's job: one e-mail and one Slack message, naming the
    tenant, the schedule, the method and redacted URL, the status and the attempt, with
    the schedule's page. Another job of the same queue succeeding recovers nothing; the
    schedule's next success recovers it, once; a restarted alerter sends nothing again."""
    inbox, port = smtp
    clock = FrozenClock()
    await listening(db)
    s = settings(port, web_receiver.base, channels=["ops_mail", "team_slack"])
    alerter = alerts.Alerter(store=db, clock=clock, settings=s)
    try:
        job_id = await fail_http(db, clock, tenant="acme", schedule="nightly")
        await pass_(alerter)
        assert (len(inbox.messages), len(slack_posts(web_receiver))) == (1, 1)
        [mail], [slack] = inbox.messages, slack_posts(web_receiver)
        title = f"[corral] quarantined: schedule nightly of tenant acme (job {job_id})"
        assert mail["Subject"] == title
        page = "https://corral.example.com/ui/schedules/acme/nightly"
        body = mail.get_content()
        for said in (
            "Tenant: acme",
            "Subject: schedule nightly",
            f"Runs: POST {SHOWN_URL}",
            f"Attempt 1: {STATUS}",
            f"Schedule: {page}",
        ):
            assert said in body
        slack_text = json.dumps(slack)
        assert slack["text"].startswith(title)
        assert f"<{page}|Open the schedule>" in slack_text
        assert f"Runs: POST {SHOWN_URL}" in slack["blocks"][1]["text"]["text"]
        assert STATUS in slack["blocks"][1]["text"]["text"]
        for seen in (body, mail["Subject"], slack_text, *(str(w) for w in web_receiver.seen)):
            assert "s3cret" not in seen
            assert ":pw@" not in seen

        await succeed(db, clock)  # another job of the queue, of no schedule
        await pass_(alerter)
        assert (len(inbox.messages), len(slack_posts(web_receiver))) == (1, 1)

        done = await succeed(db, clock, schedule="nightly", tenant="acme")
        await pass_(alerter)
    finally:
        await alerter.close()
    again = alerts.Alerter(store=db, clock=clock, settings=s)  # a restart
    try:
        await pass_(again)
        clock.advance(3600)
        await pass_(again)
    finally:
        await again.close()
    recovered = f"[corral] recovered: schedule nightly of tenant acme (job {done} succeeded)"
    assert [m["Subject"].strip() for m in inbox.messages[1:]] == [recovered]
    assert [p["text"].split(" (")[0] for p in slack_posts(web_receiver)[1:]] == [
        recovered.split(" (")[0]
    ]
    assert len(slack_posts(web_receiver)) == 2


async def test_two_schedules_failing_in_one_window_are_two_alerts_and_one_digest(
    db: store.Store, web_receiver: Web
) -> None:
    """Each schedule has its own throttle window: the second schedule's quarantine is an
    alert of its own, not a digest entry. What each window holds back goes in one digest
    of the tenant and rule, naming both schedules."""
    clock = FrozenClock()
    await listening(db)
    s = settings(0, web_receiver.base, channels=["hook"])
    alerter = alerts.Alerter(store=db, clock=clock, settings=s)
    try:
        nightly = await quarantine(db, clock, schedule="nightly")
        clock.advance(5)
        hourly = await quarantine(db, clock, schedule="hourly")
        await pass_(alerter)
        held = [await quarantine(db, clock, schedule=n) for n in ("nightly", "hourly")]
        await pass_(alerter)
        clock.advance(600)
        await pass_(alerter)
    finally:
        await alerter.close()
    sent = [json.loads(w["body"]) for w in web_receiver.seen]
    assert [(m["type"], m["subject"], m["job_id"]) for m in sent[:2]] == [
        ("corral.alert.alert", "schedule:default/nightly", nightly),
        ("corral.alert.alert", "schedule:default/hourly", hourly),
    ]
    [digest] = sent[2:]
    assert (digest["type"], digest["subject"]) == ("corral.alert.digest", "tenant:default")
    assert digest["details"]["jobs"] == held
    assert digest["details"]["subjects"] == ["schedule:default/nightly", "schedule:default/hourly"]


async def test_after_2_on_quarantined_waits_for_the_second_in_a_row_of_the_same_subject(
    db: store.Store, web_receiver: Web
) -> None:
    """`after = 2`: a schedule's first quarantine says nothing, nor another schedule's;
    its second in a row does. A success ends the row."""
    clock = FrozenClock()
    await listening(db)
    s = settings(0, web_receiver.base, channels=["hook"], on=["quarantined"], after=2)
    alerter = alerts.Alerter(store=db, clock=clock, settings=s)
    try:
        await quarantine(db, clock, schedule="nightly")
        await quarantine(db, clock, schedule="hourly")
        await pass_(alerter)
        assert web_receiver.seen == []
        second = await quarantine(db, clock, schedule="nightly")
        await pass_(alerter)
        await succeed(db, clock, schedule="hourly")  # ends hourly's row
        await quarantine(db, clock, schedule="hourly")
        await pass_(alerter)
    finally:
        await alerter.close()
    sent = [json.loads(w["body"]) for w in web_receiver.seen]
    assert [(m["subject"], m["job_id"]) for m in sent] == [("schedule:default/nightly", second)]


@pytest.mark.parametrize("key", ["invoice-42", "k" * 400])
async def test_a_keyed_job_of_no_schedule_is_its_own_subject_across_its_retries(
    db: store.Store, web_receiver: Web, key: str
) -> None:
    """A job with an idempotency key is one subject through its retries (a person's
    `dead retry`) and submissions of that key: its second quarantine falls in its window,
    a one-off job's success recovers nothing, and its own success recovers it. A key too
    long for a subject is in it by its hash, and recovers the same."""
    clock = FrozenClock()
    await listening(db)
    s = settings(0, web_receiver.base, channels=["hook"], throttle="1m")
    alerter = alerts.Alerter(store=db, clock=clock, settings=s)

    async def attempt(ok: bool) -> None:
        [c] = await db.jobs.claim(now=clock.now(), limit=1, executors=["noop"])
        end = Finish(c.attempt.id, A.SUCCEEDED, 0, None)
        if not ok:
            end = Finish(
                c.attempt.id, A.FAILED, 2, "exited with code 2", model.FailureClass.PERMANENT
            )
        await db.attempts.finish(finishes=[end], now=clock.now())

    job = model.NewJob(executor="noop", spec={}, queue="billing", idempotency_key=key)
    try:
        [(job_id, _)] = await db.jobs.submit(new=[job], now=clock.now())
        await attempt(ok=False)
        await pass_(alerter)
        [(same, _)] = await db.jobs.submit(new=[job], now=clock.now())  # that key again
        assert same == job_id
        await db.jobs.unquarantine(job_id=job_id, to=J.QUEUED, now=clock.now(), reason="fixed")
        await attempt(ok=False)  # inside its window: the digest's
        await succeed(db, clock)  # a one-off job of the same queue: not its subject
        await pass_(alerter)
        clock.advance(120)
        await db.jobs.unquarantine(job_id=job_id, to=J.QUEUED, now=clock.now(), reason="fixed")
        await attempt(ok=True)
        await pass_(alerter)
    finally:
        await alerter.close()
    sent = [json.loads(w["body"]) for w in web_receiver.seen]
    subject = sent[0]["subject"]
    assert subject == (f"key:default/{key}" if len(key) < 100 else subject)
    assert subject.startswith("key:" if len(key) < 100 else "keyhash:default/")
    assert [(m["type"], m["subject"], m["job_id"]) for m in sent] == [
        ("corral.alert.alert", subject, job_id),
        ("corral.alert.digest", "tenant:default", None),
        ("corral.alert.recovered", subject, job_id),
    ]
    assert sent[1]["details"]["subjects"] == [subject]
    assert f"/ui/jobs/{job_id}" in sent[2]["link"]


async def test_a_one_off_job_is_its_own_subject(db: store.Store, web_receiver: Web) -> None:
    """Two one-off jobs of one queue failing together: two alerts, each linking to its
    job."""
    clock = FrozenClock()
    await listening(db)
    s = settings(0, web_receiver.base, channels=["hook"])
    alerter = alerts.Alerter(store=db, clock=clock, settings=s)
    try:
        made = [await quarantine(db, clock) for _ in range(2)]
        await pass_(alerter)
    finally:
        await alerter.close()
    sent = [json.loads(w["body"]) for w in web_receiver.seen]
    assert [(m["subject"], m["link"]) for m in sent] == [
        (f"job:default/{j}", f"https://corral.example.com/ui/jobs/{j}") for j in made
    ]


def test_after_is_3_for_a_streak_and_1_for_any_other_cause_unless_set() -> None:
    rule = alert_settings.AlertRule(on=("quarantined", "consecutive_failures"), channels=("c",))
    assert (rule.in_a_row("consecutive_failures"), rule.in_a_row("quarantined")) == (3, 1)
    rule = alert_settings.AlertRule(on=("quarantined",), channels=("c",), after=2)
    assert (rule.in_a_row("consecutive_failures"), rule.in_a_row("quarantined")) == (2, 2)


def test_a_tenant_s_digest_period_is_the_same_for_all_its_subjects() -> None:
    at = FrozenClock().now()
    ten = timedelta(minutes=10)
    start, end = rules.digest_period(at, ten)
    assert start <= at < end == start + ten
    assert rules.digest_period(start + timedelta(minutes=9), ten) == (start, end)
    assert rules.digest_period(end, ten) == (end, end + ten)


@pytest.mark.parametrize("named_by_id", [1000, 1])
async def test_a_one_off_job_recovers_after_dead_retry_however_many_are_open(
    db: store.Store, web_receiver: Web, monkeypatch: pytest.MonkeyPatch, named_by_id: int
) -> None:
    """A one-off job quarantined, retried by a person and then succeeding recovers its
    own subject, and only it: whether the read of successes names the open jobs by id or
    (past ONE_OFF_IDS of them) reads their tenant's successes and keeps theirs."""
    from corral.store import alert_reads

    monkeypatch.setattr(alert_reads, "ONE_OFF_IDS", named_by_id)
    clock = FrozenClock()
    await listening(db)
    s = settings(0, web_receiver.base, channels=["hook"])
    alerter = alerts.Alerter(store=db, clock=clock, settings=s)
    try:
        made = [await quarantine(db, clock) for _ in range(3)]
        await pass_(alerter)
        await succeed(db, clock)  # another one-off job: no subject of theirs
        await db.jobs.unquarantine(job_id=made[1], to=J.QUEUED, now=clock.now(), reason="fixed")
        [c] = await db.jobs.claim(now=clock.now(), limit=1, executors=["noop"])
        done = Finish(c.attempt.id, A.SUCCEEDED, 0, None)
        await db.attempts.finish(finishes=[done], now=clock.now())
        await pass_(alerter)
    finally:
        await alerter.close()
    sent = [json.loads(w["body"]) for w in web_receiver.seen]
    assert [(m["type"], m["job_id"]) for m in sent][3:] == [("corral.alert.recovered", made[1])]
