"""The `http` executor: each attempt is one HTTP request, sent with httpx from the
dispatcher's event loop (at most `launch_concurrency` at once); its outcome is pushed
through `events`.

A request leaves nothing on a platform that corral could list afterwards, so this
executor says it is not observable (`observable = False`): the dispatcher records an
attempt `running` before its request is sent, and recovery never sends it again under
the same name. One that has no outcome by recovery_grace (corral died mid-request) is
`lost`, and its job retries as a new attempt: a higher fence, the same Idempotency-Key.

Every request carries `Corral-Job-Id`, `Corral-Attempt`, `Corral-Fence` and an
`Idempotency-Key` that is the same on every attempt of a job (the job's own key, or
`corral-job-<id>`), so a receiver can drop a retry it has already done and refuse a
stale attempt.

The guard against server-side request forgery is on by default. The URL's name is
resolved once; the request is refused if any of its addresses is loopback, private,
link-local (169.254.0.0/16, the cloud metadata address, included), shared (CGNAT),
unique-local, multicast, reserved or unspecified, IPv4 or IPv6, unless it is in
`executors.http.allow_networks`. The connection goes to the address that was checked
(no second lookup, so a name that changes its answer in between cannot slip past), with
the name kept for the Host header and TLS. Redirects are followed by corral itself, at
most MAX_REDIRECTS, each checked again; only http and https are spoken. Proxies from
the environment are not used: a proxy would make the lookup the guard cannot see.

Outcomes: a status the spec expects (`expect`, default any 2xx) succeeds, unless one of
the spec's assertions on the response fails (`expect_body`, `expect_json`,
`max_response_time`: a failure of class `assertion`, permanent unless a failure rule of
the job says otherwise). Connection
errors, timeouts, 5xx, 408 and 429 are transient failures (retried); any other status
is permanent (the job is quarantined at once); a refusal by the guard is permanent.
The reason says the status, the time it took and the address; a failure's message is
the start of the response body.

The parts, each in its module: the spec's checks (http_spec.py), the guard
(http_guard.py), building and signing the request (http_request.py), sending it
(http_send.py), and judging what came back (http_outcome.py). This module holds the
executor: its slots, its clients, its signing keys, and the outcomes it tells.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import httpx

from corral import clock, config, errors, launching
from corral.executors import http_guard, http_outcome, http_request, http_send, http_spec

log = logging.getLogger("corral.executors.http")

CLIENTS_KEPT = 64
"""Origins whose clients (and pooled connections) are kept; the least recently used closes."""
REMEMBERED = 10_000
"""How many finished requests `observe` still answers for (a poll may come after the push)."""

KEYS_FRESH_SECONDS = 5.0
"""How long a tenant's signing secrets are used before they are read again: a rotation
signs every request within this long."""


class SpecCheck:
    """Checks specs without a client (for --dry-run and submit), under these settings."""

    def __init__(self, settings: config.Settings | None = None) -> None:
        own = (settings or config.Settings()).executors.http
        self.guard = http_guard.Guard(own.allow_networks)
        self.max_body = own.max_request_body_bytes

    def validate_spec(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        return http_spec.check_spec(spec, guard=self.guard, max_body=self.max_body)


class HttpExecutor:
    """Runs each attempt as one HTTP request; see the module's doc."""

    kind = http_spec.KIND
    observable = False
    """A request leaves nothing to list: the dispatcher records an attempt running before
    it is sent, and recovery never sends it again under the same name."""

    def __init__(
        self,
        *,
        clock: clock.Clock,
        timeout: timedelta,
        concurrency: int,
        allow_networks: Iterable[str] = (),
        body_bytes: int = 65_536,
        max_body: int = http_spec.MAX_REQUEST_BODY,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._clock = clock
        self._timeout = timeout.total_seconds()
        self._slots = asyncio.Semaphore(concurrency)
        self.guard = http_guard.Guard(allow_networks)
        self._body_bytes = body_bytes
        self._max_body = max_body
        self._transport = transport
        self._clients: collections.OrderedDict[str, httpx.AsyncClient] = collections.OrderedDict()
        self._closing: set[asyncio.Future[None]] = set()
        self._started = self._draining = False
        self._running: dict[str, tuple[launching.Launch, asyncio.Task[None]]] = {}
        self._ended: collections.OrderedDict[str, launching.Observation] = collections.OrderedDict()
        self._news: asyncio.Queue[launching.Observation | None] = asyncio.Queue()
        self._closed = False
        self._keys: Callable[[str], Awaitable[list[str]]] | None = None
        self._keys_read: dict[str, tuple[float, list[str]]] = {}

    def use_signing_keys(self, keys: Callable[[str], Awaitable[list[str]]]) -> None:
        """Sign each request with the secrets `keys(tenant)` gives (the store's, wired by
        the runtime); a tenant with none sends unsigned requests."""
        self._keys = keys

    async def _signing_keys(self, tenant: str) -> list[str]:
        if self._keys is None:
            return []
        now = time.monotonic()
        read = self._keys_read.get(tenant)
        if read is None or read[0] < now:
            read = (now + KEYS_FRESH_SECONDS, await self._keys(tenant))
            self._keys_read[tenant] = read
        return read[1]

    def validate_spec(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        return http_spec.check_spec(spec, guard=self.guard, max_body=self._max_body)

    async def start(self) -> None:
        self._started = True

    def _client(self, origin: str) -> httpx.AsyncClient:
        """The client of one origin (scheme, host name, port): its pooled connections were
        made, and their certificates checked, for that name only."""
        client = self._clients.pop(origin, None)
        if client is None:
            client = httpx.AsyncClient(
                follow_redirects=False, trust_env=False, transport=self._transport
            )
        self._clients[origin] = client  # the most recently used last
        while len(self._clients) > CLIENTS_KEPT:
            _, oldest = self._clients.popitem(last=False)
            self._closing.add(asyncio.ensure_future(oldest.aclose()))
        return client

    async def drain(self) -> list[launching.Observation]:
        """Take no more launches, let the requests in flight end (each is bounded by
        http_request_timeout), and return what ended that `events` has not yielded: the
        dispatcher writes those before it stops, so a stop loses no outcome."""
        self._draining = True
        tasks = [task for _, task in self._running.values()]
        if tasks:
            await asyncio.wait(tasks, timeout=self._timeout + 1)
        pending = []
        while not self._news.empty():
            if (observation := self._news.get_nowait()) is not None:
                pending.append(observation)
        return pending

    async def close(self) -> None:
        """Stop: requests still in flight are dropped (their attempts are lost to recovery,
        as if corral had died; `drain` first to let them end), and `events` ends."""
        self._closed = True
        for _, task in list(self._running.values()):
            task.cancel()
        await asyncio.gather(*(t for _, t in self._running.values()), return_exceptions=True)
        self._news.put_nowait(None)
        for client in self._clients.values():
            await client.aclose()
        await asyncio.gather(*self._closing, return_exceptions=True)

    async def launch(self, launch: launching.Launch) -> None:
        """Start the request in the background, once one of the `concurrency` slots is free
        (a slow receiver holds the dispatcher's launches back, not piles of attempts that
        wait unsent), and return; a name launched before (running or ended here) is never
        sent again."""
        if self._closed or self._draining or not self._started:
            raise errors.ExecutorError("http executor: not started, or stopping")
        if launch.name in self._running or launch.name in self._ended:
            return
        spec = self.validate_spec(launch.spec)
        await self._slots.acquire()
        if launch.name in self._running or launch.name in self._ended:  # asked twice meanwhile
            self._slots.release()
            return
        task = asyncio.create_task(self._run(launch, spec), name=f"http {launch.name}")
        self._running[launch.name] = (launch, task)
        task.add_done_callback(lambda done: self._settled(launch, spec, done))

    def _settled(
        self, launch: launching.Launch, spec: dict[str, Any], task: asyncio.Task[None]
    ) -> None:
        """Whatever became of the task, its slot is free and, unless corral is stopping,
        its attempt has an outcome: one cancelled before it began, or that failed in a way
        `_run` did not foresee, is recorded so, never left running."""
        self._slots.release()
        if launch.name not in self._running or self._closed:
            return
        if task.cancelled():
            self._record(launch, spec, http_outcome.Outcome(error="cancelled"), self._clock.now())
        elif (exc := task.exception()) is not None:
            log.error("http executor: %s failed unforeseen", launch.name, exc_info=exc)
            self._record(
                launch,
                spec,
                http_outcome.Outcome(error=f"{type(exc).__name__}: {exc}"),
                self._clock.now(),
            )

    async def _run(self, launch: launching.Launch, spec: dict[str, Any]) -> None:
        started = self._clock.now()
        request: launching.Stream | None = None
        try:
            headers = http_request.request_headers(launch, spec)
            try:
                content = http_request.request_body(spec, launch.payload, headers)
                url = http_request.fill(spec["url"], launch.payload, quote=True)
                keys = await self._signing_keys(launch.tenant)
                if keys:
                    http_request.sign(headers, content, keys, self._clock.now())
                request = http_outcome.request_stream(
                    spec["method"], url, headers, content, self._body_bytes
                )
            except errors.TemplateError as exc:
                outcome = http_outcome.Outcome(refused=f"template: {exc}")
            except UnicodeDecodeError:
                outcome = http_outcome.Outcome(refused="a signed request's body must be UTF-8 text")
            except errors.CorralError as exc:  # the store, for the keys: try again later
                outcome = http_outcome.Outcome(error=f"could not read the signing secrets: {exc}")
            else:
                outcome = await http_send.send(
                    self._client,
                    self.guard,
                    method=spec["method"],
                    url=url,
                    headers=headers,
                    content=content,
                    seconds=min(self._timeout, launch.deadline_seconds or self._timeout),
                    body_bytes=self._body_bytes,
                )
        except asyncio.CancelledError:
            if self._closed:
                raise
            outcome = http_outcome.Outcome(error="cancelled")
        self._record(launch, spec, outcome, started, request, await _judged(outcome, spec))

    def _record(
        self,
        launch: launching.Launch,
        spec: dict[str, Any],
        outcome: http_outcome.Outcome,
        started: datetime,
        request: launching.Stream | None = None,
        judged: http_outcome.Verdict | None = None,
    ) -> None:
        judged = judged or http_outcome.verdict(outcome, spec)
        ended = self._clock.now()
        observation = launching.Observation(
            name=launch.name,
            phase=judged.phase,
            labels=launch.labels,
            reason=judged.reason,
            started_at=started,
            finished_at=ended,
            failure_class=judged.failure,
            message=judged.message,
            retry_after=None
            if judged.phase is launching.Phase.SUCCEEDED
            else http_outcome.retry_after_seconds(outcome.retry_after, ended),
            http_status=outcome.status,
            output=http_outcome.run_log(request, outcome, judged.checks),
        )
        self._running.pop(launch.name, None)
        self._ended[launch.name] = observation
        while len(self._ended) > REMEMBERED:
            self._ended.popitem(last=False)
        self._news.put_nowait(observation)

    async def observe(self, names: Sequence[str]) -> dict[str, launching.Observation]:
        """What this process knows: a request in flight runs, one that ended says how; any
        other name is absent (sent by a process that is gone, or never sent)."""
        return {name: self._look(name) for name in names}

    def _look(self, name: str) -> launching.Observation:
        if (running := self._running.get(name)) is not None:
            return launching.Observation(name, launching.Phase.RUNNING, running[0].labels)
        return self._ended.get(name) or launching.Observation(name, launching.Phase.ABSENT)

    async def list_managed(self, selector: Mapping[str, str]) -> list[launching.Observation]:
        names = [*self._running, *self._ended]
        seen = [self._look(name) for name in names]
        return [o for o in seen if all(o.labels.get(k) == v for k, v in selector.items())]

    async def cancel(self, name: str, grace: timedelta) -> None:
        """Abandon the request: its attempt ends failed, `cancelled` (the server may have
        acted on it already)."""
        if (running := self._running.get(name)) is not None:
            running[1].cancel()

    async def events(self) -> AsyncGenerator[launching.Observation, None]:
        """Each request's outcome, as it comes, until `close`."""
        while not self._closed:
            observation = await self._news.get()
            if observation is None:
                return
            yield observation


def build(settings: config.Settings, clk: clock.Clock) -> HttpExecutor:
    http = settings.executors.http
    return HttpExecutor(
        clock=clk,
        timeout=settings.timeouts.http_request_timeout,
        concurrency=settings.launch_concurrency,
        allow_networks=http.allow_networks,
        body_bytes=http.body_bytes,
        max_body=http.max_request_body_bytes,
    )


async def _judged(
    outcome: http_outcome.Outcome, spec: Mapping[str, Any]
) -> http_outcome.Verdict | None:
    """The verdict of a response with `expect_body`, judged off the event loop (None for
    any other: `_record` judges it). A match is linear in the body, yet a large pattern on
    64 KiB takes a while (http_assertions.MAX_PROGRAM_SIZE), and RE2 lets the GIL go."""
    if "expect_body" not in spec or outcome.status is None:
        return None
    return await asyncio.to_thread(http_outcome.verdict, outcome, spec)
