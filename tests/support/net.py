"""Loopback ports for tests that start servers, or need an address nothing answers on, and
an HTTP server there that answers every request with a handler of the test's."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def free_port() -> int:
    """A loopback port nothing listens on (bound, then let go): connecting to it is refused
    until something listens there."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def http_server(handle: Handler) -> AsyncIterator[str]:
    """An HTTP server on a free port of 127.0.0.1 that answers every method and path with
    `handle`, for as long as the block runs: its base URL (`http://127.0.0.1:PORT`)."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
