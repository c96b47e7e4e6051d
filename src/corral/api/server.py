"""Serving the API with uvicorn in corral's own event loop, stopped by corral's own
signal handling (`corral serve --http`, `corral api --http`), and the attempt API on a
Unix socket for the process jobs of a dispatcher without api_url (`serve_attempts`)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Generator
from pathlib import Path
from typing import Any

import uvicorn

from corral import client, clock, config, errors, runtime
from corral.api import create_app, create_attempt_app
from corral.worker.api import socket_path

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
    settings: config.Settings,
    http: str,
    stop: asyncio.Event,
    *,
    pulse: bool = True,
    sock: socket.socket | None = None,
    on_ready: Callable[[client.Client], Awaitable[None]] | None = None,
) -> None:
    """Serve the API on `http` (HOST:PORT; on `sock` when it is bound already, see
    `listen`) until `stop`, on a client of its own that starts no executor (a cancel marks
    the attempt; its dispatcher stops the run), with a runner of bulk operations beside
    it; `on_ready` is called once the store is reached. With `pulse`, the process is
    recorded in the loops table as `api` (corral.loops); without, whoever runs it beside
    other loops records it."""
    host, port = address(http)
    sock = sock or listen(http)
    async with runtime.connect(settings, platforms=False) as c, _pulse(c, on=pulse):
        if on_ready is not None:
            await on_ready(c)
        server = _Server(
            uvicorn.Config(
                create_app(c),
                host=host,
                port=port,
                proxy_headers=False,  # the peer is the client, unless [api] trusted_proxies
                log_level="warning",
                access_log=False,
                lifespan="off",
            )
        )
        await _served(server, sock, c, stop)
        if not server.started and not stop.is_set():
            raise errors.ConfigError(f"--http {http}: could not serve there")


async def _served(
    server: uvicorn.Server, sock: socket.socket, c: client.Client, stop: asyncio.Event
) -> None:
    """Serve on `sock` until `stop` (or the server ends), with a runner of bulk operations
    beside it, stopped with it."""
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    stopping = asyncio.create_task(stop.wait())
    halt = asyncio.Event()  # the runner's: set when the server ends, whyever it does
    operating = asyncio.create_task(c.runner().run(halt))
    await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    server.should_exit = True
    stopping.cancel()
    halt.set()
    await serving
    await operating
    sock.close()


def listen(http: str) -> socket.socket:
    """A socket listening on `http` (HOST:PORT), bound before anything says it is served:
    ConfigError naming `--http HOST:PORT` where it cannot be (a port in use, an address
    this host has not)."""
    host, port = address(http)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.create_server((host, port), family=family, backlog=2048)
        # Each accepted connection inherits it. asyncio sets it only on sockets made with
        # proto IPPROTO_TCP (create_server's are proto 0), and without it an answer on a
        # kept-alive connection waits ~40 ms for the client's delayed ACK (Nagle).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    except OSError as exc:
        busy = " (is another corral serving there?)" if exc.errno == errno.EADDRINUSE else ""
        raise errors.ConfigError(
            f"--http {http}: could not listen there: {exc.strerror or exc}{busy}; pick"
            " another HOST:PORT"
        ) from None


TAKE_OVER_SECONDS = 5.0
"""How often a process whose attempt socket another corral answers looks whether it still
does (it takes the socket over once that one has stopped)."""


async def serve_attempts(
    settings: config.Settings, stop: asyncio.Event, *, c: client.Client | None = None
) -> None:
    """Answer the attempt API (heartbeats, payloads, checkpoints, publish pointers: an
    attempt's own calls, with its token) on the Unix socket settings.attempt_socket, until
    `stop`, on the client `c` (else one of its own, once the database can be reached).
    Another corral on the same state folder may answer it already (its jobs and ours are
    in one store): then this one waits, and takes over once that one stops."""
    if c is not None:
        await _answer_attempts(c, settings.attempt_socket, stop)
        return
    clk = clock.SystemClock()
    db = await runtime.reach(settings, clk, stop)  # waits for the database, as the loops do
    if db is None:
        return
    async with runtime.opened(settings, clk=clk, executors={}, db=db) as rt:
        own = rt.client()
        await _answer_attempts(own, settings.attempt_socket, stop)


async def _answer_attempts(c: client.Client, path: Path, stop: asyncio.Event) -> None:
    while not stop.is_set():
        sock = await asyncio.to_thread(_listen_unix, path)
        if sock is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), TAKE_OVER_SECONDS)
            continue
        log.info("the attempt API for process jobs: unix:%s", path)
        identity = os.stat(path)
        server = _Server(
            uvicorn.Config(
                create_attempt_app(c), log_level="warning", access_log=False, lifespan="off"
            )
        )
        try:
            serving = asyncio.create_task(server.serve(sockets=[sock]))
            stopping = asyncio.create_task(stop.wait())
            await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
            server.should_exit = True
            stopping.cancel()
            await serving
            if not server.started and not stop.is_set():
                raise errors.ConfigError(f"the attempt socket {path}: uvicorn could not serve it")
        finally:
            sock.close()
            with contextlib.suppress(OSError):
                now = os.stat(path)
                if (now.st_dev, now.st_ino) == (identity.st_dev, identity.st_ino):
                    os.unlink(path)  # ours still: no other corral's


def _listen_unix(path: os.PathLike[str] | str) -> socket.socket | None:
    """A listening socket bound at `path`, which anyone may connect to (an attempt's token
    is its authority, and a job may run as another user); None when another process
    answers there. A socket left by a corral that died is replaced."""
    parent = os.path.dirname(os.fspath(path))
    os.makedirs(parent, mode=0o711, exist_ok=True)
    os.chmod(parent, 0o711)  # any job's user reaches the socket; nobody lists the folder
    where, folder = socket_path(os.fspath(path))
    try:
        for _ in range(2):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.bind(where)
            except OSError as exc:
                sock.close()
                if exc.errno != errno.EADDRINUSE or _answered(where):
                    if exc.errno == errno.EADDRINUSE:
                        return None
                    raise errors.ConfigError(
                        f"the attempt socket {path}: could not listen there: {exc}"
                    ) from None
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(where)  # a dead corral's
                continue
            os.chmod(where, 0o666)
            sock.listen(128)
            sock.setblocking(False)
            return sock
        return None
    finally:
        if folder is not None:
            os.close(folder)


def _answered(where: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(where)
        except OSError:
            return False
        return True
