"""The alerter: reads the run log (the events table) from a durable cursor, turns what
matches a rule into messages (corral.alerts.rules, pure), writes them to the outbox in
the transaction that moves its cursor, and delivers them, at least once, off the hot path.

Any number of alerters may run on PostgreSQL: the cursor is moved by compare-and-set, so
one of two that read the same events writes their messages and the other writes nothing;
every message is unique on its dedupe key besides. Event ids are handed out as
transactions begin but appear as they commit: an id not there yet is waited for, up to
`timeouts.database_transaction_timeout` (no transaction outlives it), before the reader
goes past it as a rollback's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime, timedelta

import httpx

from corral import alert_settings, clock, config, errors, failpoints, metrics, model, store
from corral.alerts import channels, owned, rules
from corral.store.alert_reads import EventsRead, JobFacts
from corral.store.alerts import Alert

log = logging.getLogger("corral.alerts")

BATCH = 5000
"""Most events one pass reads (only the few that can make a message are read whole)."""
TRIES = 10
"""Tries of a message before it is given up (state `failed`)."""
BACKOFF = (5.0, 600.0)
"""The first retry's wait and the longest, in seconds; doubling between."""
IN_FLIGHT = 4
"""Deliveries at once, per channel configured."""
STOP_GRACE = 5.0
"""Seconds a stopping alerter waits for the deliveries in flight (sent again later)."""


class Alerter:
    """Reads events into messages, and delivers them (`run`, or a pass each with
    `read_once` and `deliver_once`)."""

    def __init__(
        self,
        *,
        store: store.Store,
        clock: clock.Clock,
        settings: config.Settings,
        name: str = "alerter",
        every: float = 1.0,
    ) -> None:
        self.store = store
        self.clock = clock
        self.settings = settings
        self.rules = settings.alerts.rules  # the settings' and, each pass, tenants' (owned)
        self.owned = owned.Owned(store=store, settings=settings, now=clock.now)
        self.name = name
        self.every = every
        self.channels = {
            n: channels.build(n, settings, clock.now) for n in settings.alerts.channels
        }
        # Starts (a quarter of the events) are read only for a rule on late firings.
        self._starts = any("schedule_late" in r.on for r in self.rules.values())
        self._gaps: dict[int, float] = {}  # event ids not there yet: when first missed
        self._gap_wait = settings.timeouts.database_transaction_timeout.total_seconds() + 1
        self._in_flight: dict[int, asyncio.Task[None]] = {}
        self._seconds = {  # each channel's whole send, bounded
            n: c.timeout.total_seconds() for n, c in settings.alerts.channels.items()
        }
        self._lease = timedelta(seconds=max(self._seconds.values(), default=30.0) + 30)

    async def run(self, stop: asyncio.Event, *, on_pass: Callable[[], None] | None = None) -> None:
        """Read and deliver every `every` seconds until `stop`; then let the deliveries in
        flight end (each within its channel's timeout)."""
        log.info("alerter started: %d rules, %d channels", len(self.rules), len(self.channels))
        while not stop.is_set():
            try:
                while await self.read_once() == BATCH:
                    if on_pass is not None:
                        on_pass()  # catching up is being alive
                await self.deliver_once()
            except errors.CorralError as exc:
                log.error("alerter pass failed, trying again: %s", exc)
            except Exception:  # a bug here must never stop the loops beside it
                log.exception("alerter pass failed unforeseen, trying again")
            if on_pass is not None:
                on_pass()
            await clock.sleep_or_stop(self.clock, stop, self.every)
        if self._in_flight:  # each bounded by its channel's timeout; then given up
            _, late = await asyncio.wait(self._in_flight.values(), timeout=STOP_GRACE)
            for task in late:
                task.cancel()
        await self.close()
        log.info("alerter stopped")

    async def close(self) -> None:
        for channel in self.channels.values():
            if isinstance(channel, channels._Web):
                await channel.close()
        await self.owned.close()

    # --- reading ----------------------------------------------------------------------

    async def read_once(self) -> int:
        """Read the events after the cursor and write what they make: how many were read.
        A first alerter starts after the newest event: it alerts on what happens from
        now on, not on the whole history."""
        now = self.clock.now()
        await self._read_rules()
        got = await self.store.alerts.read(
            name=self.name, limit=BATCH, now=now, with_starts=self._starts
        )
        cursor, read = got.cursor, got.events
        if cursor is None:
            await self._start(now)
            return 0
        upto = self._in_order(cursor, read)
        if upto == cursor:
            return 0
        found = [(e, j) for e, j in read.found if e.id <= upto]
        made = await self._plan_batch(cursor, upto, found, read, frozenset(got.muted))
        wrote = await self._write(cursor, upto, made, now)
        return len(read.ids) if wrote else 0

    async def _read_rules(self) -> None:
        """The rules of this pass: the settings' and every tenant's, as they stand now."""
        await self.owned.refresh()
        self.rules = {**self.settings.alerts.rules, **self.owned.rules}
        self._starts = any("schedule_late" in r.on for r in self.rules.values())

    async def _start(self, now: datetime) -> None:
        """Set a first alerter's cursor at the newest event."""
        start = await self.store.alerts.event_newest()
        await self.store.alerts.write(
            name=self.name, read_from=0, read_to=start, messages=[], digested=[], now=now
        )
        log.info("alerter %s: alerts on what happens after event %d", self.name, start)

    async def _plan_batch(
        self,
        cursor: int,
        upto: int,
        found: list[tuple[model.Event, JobFacts | None]],
        read: EventsRead,
        muted: frozenset[str],
    ) -> rules.Plan:
        """What the events in (cursor, upto] make. A subject a failure of this batch opened
        hears of its successes in it too, though the batch read no success of it."""
        made = await self._plan(found, muted)
        opened = {k[1] for k, v in made.standing.items() if v.owes_recovery or v.streak}
        if opened - read.open:
            more = await self.store.alerts.successes(
                after=cursor, upto=upto, subjects=sorted(opened - read.open)
            )
            if more:
                made = await self._plan(sorted([*found, *more], key=lambda f: f[0].id), muted)
        return made

    async def _write(self, cursor: int, upto: int, made: rules.Plan, now: datetime) -> bool:
        """Write what the events in (cursor, upto] made as the cursor moves to `upto`:
        False when another alerter moved it first (it wrote them)."""
        messages, digested = made.messages, made.digested
        wrote = await self.store.alerts.write(
            name=self.name,
            read_from=cursor,
            read_to=upto,
            messages=[_row(m) for m in messages],
            digested=[_digested(d) for d in digested],
            now=now,
            standing={
                k: (v.window_at, v.owes_recovery, v.streak) for k, v in made.standing.items()
            },
        )
        if wrote and (messages or digested):
            failpoints.hit("after_alerts_written")
            log.info(
                "events %d..%d: %d messages, %d into digests",
                cursor + 1,
                upto,
                len(messages),
                len(digested),
            )
        return wrote

    async def _plan(
        self, found: list[tuple[model.Event, JobFacts | None]], muted: frozenset[str]
    ) -> rules.Plan:
        """What `found` makes (rules.plan), given where its rules and subjects stand."""
        seen = [h for event, job in found if (h := rules.happening(event, job)) is not None]
        pairs = [
            (name, rules.subject(h))
            for h in seen
            for name, rule in self.rules.items()
            if rules.matches(rule, h)
        ]
        sent = await self.store.alerts.sent(pairs=pairs)
        return rules.plan(
            seen, self.rules, {k: rules.Sent(*v) for k, v in sent.items()}, muted=muted
        )

    def _in_order(self, cursor: int, read: EventsRead) -> int:
        """How far the events can be read now: in id order with no id missing, but one
        that has been missing longer than any transaction lives (a rollback's)."""
        now, mono = self.clock.now(), self.clock.monotonic()
        expected = cursor + 1
        for i in read.ids:  # every gap in sight waits from now, all at once
            if i != expected:
                self._gaps.setdefault(expected, mono)
            expected = i + 1
        upto = cursor
        for i in read.ids:
            if i != upto + 1:
                waited = mono - self._gaps.get(upto + 1, mono)
                # The missing ids' transactions began before this event's, which began
                # at its `at`: past two transaction timeouts from it, none is alive.
                at = read.at_after_gap.get(i, now)
                long_ago = (now - at).total_seconds() > 2 * self._gap_wait
                if waited < self._gap_wait and not long_ago:
                    break
                self._gaps.pop(upto + 1, None)
            upto = i
        return upto

    # --- delivering -------------------------------------------------------------------

    async def deliver_once(self) -> int:
        """Start delivering the messages that are due, each claimed for one delivery (at
        most IN_FLIGHT per channel configured at once): how many were started."""
        self._in_flight = {i: t for i, t in self._in_flight.items() if not t.done()}
        room = IN_FLIGHT * max(len(self.channels), 1) - len(self._in_flight)
        if room <= 0:
            return 0
        due = await self.store.alerts.claim(now=self.clock.now(), limit=room, lease=self._lease)
        for a in due:
            self._in_flight[a.id] = asyncio.create_task(self._deliver(a))
        return len(due)

    async def deliver_now(self, alert_id: int) -> None:
        """Deliver one message at once, whatever its time (`corral alerts test`)."""
        for a in await self.store.alerts.claim(
            now=self.clock.now(), limit=1, lease=self._lease, ids=[alert_id]
        ):
            await self._deliver(a)

    async def deliver_all(self) -> None:
        """Deliver what is due now and wait for every try (tests, `alerts test`)."""
        await self.deliver_once()
        await asyncio.gather(*self._in_flight.values(), return_exceptions=True)

    async def _deliver(self, a: Alert) -> None:
        channel, error = await self._channel(a.channel)
        if channel is not None:
            try:
                async with asyncio.timeout(self._seconds.get(a.channel, 30.0)):
                    await channel.send(channels.render(a, self.settings.public_base))
            except errors.Undelivered as exc:
                error = str(exc)
            except TimeoutError:
                error = f"no answer in {self._seconds.get(a.channel, 30.0):g}s"
            except Exception as exc:  # a channel's bug must not stop the others
                log.exception("channel %s failed unforeseen", a.channel)
                error = f"{type(exc).__name__}: {exc}"
        now = self.clock.now()
        retry_at = None
        if error is not None and a.tries + 1 < TRIES:
            base, cap = BACKOFF
            retry_at = now + timedelta(seconds=min(cap, base * 2**a.tries))
        self._count(a.channel, error, retry_at)
        if error is None:
            log.info("alert %d (%s) delivered to %s", a.id, a.dedupe_key, a.channel)
        else:
            log.warning("alert %d to %s: try %d failed: %s", a.id, a.channel, a.tries + 1, error)
        try:
            await self.store.alerts.tried(alert_id=a.id, now=now, error=error, retry_at=retry_at)
        except errors.CorralError as exc:  # delivered at least once: it may go again
            log.error("alert %d: its try not recorded: %s", a.id, exc)

    async def _channel(
        self, name: str
    ) -> tuple[channels.Email | channels.Slack | channels.Webhook | None, str | None]:
        """The channel `name` (the settings', or a tenant's), or why there is none."""
        if name in self.channels:
            return self.channels[name], None
        if not name.startswith(alert_settings.TENANT_PREFIX):
            return None, f"no channel named {name!r} in the settings"
        try:
            return await self.owned.channel(name), None
        except errors.Undelivered as exc:
            return None, str(exc)

    def _count(self, name: str, error: str | None, retry_at: datetime | None) -> None:
        """Count a try in corral_alert_deliveries_total, by its channel's kind."""
        configured = self.settings.alerts.channels.get(name)
        outcome = "delivered" if error is None else "given_up" if retry_at is None else "failed"
        kind = configured.kind if configured is not None else self.owned.kind(name) or "unknown"
        metrics.ALERT_DELIVERIES.labels(channel=kind, outcome=outcome).inc()


class Heartbeat:
    """A dead man's switch: a GET of `url` after every reconciler pass, so a monitor
    outside corral notices when the passes stop. One ping at a time; a ping that fails is
    logged, never in the pass's way."""

    def __init__(self, url: str, *, seconds: float = 10.0) -> None:
        self.url = url
        self.seconds = seconds
        self._ping: asyncio.Task[None] | None = None
        self._client: httpx.AsyncClient | None = None

    def __call__(self) -> None:
        if self._ping is None or self._ping.done():
            self._ping = asyncio.ensure_future(self._get())

    async def _get(self) -> None:
        if self._client is None:
            self._client = httpx.AsyncClient(trust_env=False, timeout=self.seconds)
        try:
            response = await self._client.get(self.url)
            if response.is_error:
                log.warning("heartbeat_url answered %d", response.status_code)
        except httpx.HTTPError as exc:
            log.warning("heartbeat_url not reached: %s", type(exc).__name__)

    async def close(self) -> None:
        if self._ping is not None:
            await asyncio.gather(self._ping, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()


def _row(m: rules.Message) -> dict[str, object]:
    return {
        "dedupe_key": m.dedupe_key,
        "rule": m.rule,
        "channel": m.channel,
        "kind": m.kind,
        "cause": m.cause,
        "subject": m.subject,
        "job_id": m.job_id,
        "details": dict(m.details),
        "due_at": m.due_at,
    }


def _digested(d: rules.Digested) -> dict[str, object]:
    return {
        "dedupe_key": d.dedupe_key,
        "rule": d.rule,
        "channel": d.channel,
        "subject": d.subject,
        "window_start": d.window_start,
        "window_end": d.window_end,
        "job_id": d.job_id,
        "cause": d.cause,
        "tenant": d.tenant,
        "about": d.about,
    }
