"""Serving the API with uvicorn in corral's own event loop, stopped by corral's own
signal handling (`corral serve --http`, `corral api --http`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Generator
from typing import Any

import uvicorn

from corral import client, config, errors, operations, runtime
from corral.api import create_app

log = logging.getLogger("corral.api")


def address(given: str, *, option: str = "--http") -> tuple[str, int]:
    """HOST:PORT (IPv6 in brackets: [::1]:8080) as host and port; InvalidInput naming
    `option` if not."""
    host, sep, port = given.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise errors.InvalidInput(
            f"{option}: {given!r} is not HOST:PORT, e.g. 127.0.0.1:8080 or [::1]:8080"
        )
    return host, int(port)


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # corral's own handlers set `stop`, which ends the server


def _pulse(c: client.Client, *, on: bool) -> contextlib.AbstractAsyncContextManager[Any]:
    """The `api` process's row in the loops table, beaten while it serves (when `on`)."""
    if not on:
        return contextlib.nullcontext()
    return c.loops.pulse(kind="api", runs=("api", "operations")).beating()


async def serve_http(
    settings: config.Settings, http: str, stop: asyncio.Event, *, pulse: bool = True
) -> None:
    """Serve the API on `http` (HOST:PORT) until `stop`, on a client of its own that
    starts no executor (a cancel marks the attempt; its dispatcher stops the run), with a
    runner of bulk operations beside it. With `pulse`, the process is recorded in the loops
    table as `api` (corral.loops); without, whoever runs it beside other loops records it."""
    host, port = address(http)
    async with runtime.connect(settings, platforms=False) as c, _pulse(c, on=pulse):
        server = _Server(
            uvicorn.Config(
                create_app(c),
                host=host,
                port=port,
                log_level="warning",
                access_log=False,
                lifespan="off",
            )
        )
        serving = asyncio.create_task(server.serve())
        stopping = asyncio.create_task(stop.wait())
        halt = asyncio.Event()  # the runner's: set when the server ends, whyever it does
        runner = operations.Runner(store=c.store, clock=c.clock, settings=c.settings)
        operating = asyncio.create_task(runner.run(halt))
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
        server.should_exit = True
        stopping.cancel()
        halt.set()
        await serving
        await operating
        if not server.started:
            raise errors.ConfigError(f"--http: could not listen on {http}")
