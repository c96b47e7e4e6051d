"""Loopback ports for tests that start servers, or need an address nothing answers on, and
servers there: an aiohttp one that answers every request with a handler of the test's, or
the test's own (`http.server`) served from a thread."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TypeVar

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Server = TypeVar("Server", bound=socketserver.BaseServer)


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


@contextlib.contextmanager
def in_thread(server: Server) -> Iterator[Server]:
    """`server` serving from a daemon thread for as long as the block runs, then shut down
    and closed."""
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
