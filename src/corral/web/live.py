"""Live updates over server-sent events: a page that goes on changing (a job's, a bulk
operation's, the overview) opens a stream of its own under /ui, and the server pushes the
part of the page that changed, drawn anew, which htmx's SSE extension (vendored in
static/, beside htmx) swaps in. The browser asks for nothing more while the stream lasts.

A stream is the session's, by its cookie, and shows only what its page shows: a job or
an operation of another tenant is not found (404) before any stream starts, and the
overview's stream draws the session's tenant's overview only. It looks at the store every
few seconds on the server (`look`: something small that changes with the page, such as
the job's newest event) and draws only when that moved. It ends when its page's subject
stops changing (the last drawing, then an `end` message, on which the page closes it),
when its session ends, and after MAX_SECONDS (the page then connects again). The first
message of every stream is the part as it is now, so a page that connects again after a
drop misses nothing. At most MAX_STREAMS of them run in a process (the API's event streams
have their own as many); one more is refused with 429, and the page, which still shows
what it had, tries again later, waiting longer each time (the extension's back-off).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from sse_starlette.sse import EventSourceResponse
from starlette.background import BackgroundTask

from corral import errors
from corral.web import auth

POLL = 0.5
"""Seconds between looks at what a job's or an operation's page shows."""
MAX_SECONDS = 3600.0
"""How long one stream lasts at most; the page then connects again."""
MAX_STREAMS = 100
"""The most dashboard streams one process serves at once; one more is refused (429)."""
RETRY_MS = 2000
"""How long a browser waits before it connects again after a stream ended."""


@dataclass(frozen=True, slots=True)
class Drawn:
    """What a stream pushes: each part by its message's name (the element with that
    `sse-swap` takes it), and whether its subject may still change."""

    parts: Mapping[str, str]
    goes_on: bool = True


Look = Callable[[], Awaitable[Hashable]]
Draw = Callable[[], Awaitable[Drawn]]


class Slots:
    """The streams a process serves now, at most `limit` of them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.taken = 0

    def take(self) -> Callable[[], None] | None:
        """A slot and how to give it back (once, however often called); None when all
        are taken."""
        if self.taken >= self.limit:
            return None
        self.taken += 1
        given_back = False

        def give_back() -> None:
            nonlocal given_back
            if not given_back:
                given_back, self.taken = True, self.taken - 1

        return give_back


def stream(request: Request, look: Look, draw: Draw, *, every: float = POLL) -> EventSourceResponse:
    """The stream of a page: its parts drawn now, then again each time `look` (asked every
    `every` seconds) gives something else, until the subject stops changing, the session
    ends, the client leaves or MAX_SECONDS pass. TooManyStreams when the process serves
    MAX_STREAMS already."""
    state = request.app.state
    slots = getattr(state, "live_slots", None)
    if slots is None:
        slots = state.live_slots = Slots(MAX_STREAMS)
    give_back = slots.take()
    if give_back is None:
        raise errors.TooManyStreams(
            f"{slots.limit} live pages are open already: this one updates later"
        )
    pushes = _Pushes(request, look, draw, every)

    async def held() -> AsyncIterator[dict[str, Any]]:
        try:
            async for m in pushes.messages():
                yield m
        finally:
            give_back()

    return EventSourceResponse(held(), ping=15, background=BackgroundTask(give_back))


class _Pushes:
    """One stream's messages: what `draw` gives, each time `look` moves."""

    def __init__(self, request: Request, look: Look, draw: Draw, every: float) -> None:
        self.request, self.look, self.draw, self.every = request, look, draw, every
        self.c = auth.client_of(request)
        self.secret = request.cookies.get(auth.COOKIE, "")
        self.ends = self.c.clock.monotonic() + MAX_SECONDS

    async def messages(self) -> AsyncIterator[dict[str, Any]]:
        seen = await self.look()  # before drawing: a change meanwhile is looked at again
        drawn, first = await self.draw(), True
        while True:
            for name, html in drawn.parts.items():
                yield {"event": name, "data": html, **({"retry": RETRY_MS} if first else {})}
                first = False
            if not drawn.goes_on:
                yield {"event": "end", "data": ""}
                return
            moved = await self._moved(seen)
            if moved is None:
                return
            seen, drawn = moved, await self.draw()

    async def _moved(self, seen: Hashable) -> Hashable | None:
        """What `look` gives once it is not `seen`; None when the stream should end."""
        while self.c.clock.monotonic() < self.ends:
            await self.c.clock.sleep(self.every)
            if await self.request.is_disconnected() or not await self.c.session(self.secret):
                return None
            now = await self.look()
            if now != seen:
                return now
        return None
