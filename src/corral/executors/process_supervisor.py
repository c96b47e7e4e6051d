"""The `process` executor's end of its supervisor (process_shim.py, run as a script):
started detached at the first launch and again whenever it is found dead, a request per
launch (the files of its run folder, `launch_files`) and its answer, and the names of the
runs whose commands it says ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from corral import clock, errors, launching
from corral.executors import process_child, process_runs

log = logging.getLogger("corral.executors.process")

SHIM = Path(__file__).with_name("process_shim.py")


SHIM_ANSWER_SECONDS = 30.0
"""How long `launch` waits for the shim to say `started` or `exists`."""


def launch_files(launch: launching.Launch, spec: dict[str, Any], log_bytes: int) -> dict[str, Any]:
    """What a run folder starts with, by file name: the supervisor writes them (the payload,
    when there is one, as JSON text, so that it is written as every executor delivers it)."""
    launch_doc = {
        "name": launch.name,
        "labels": dict(launch.labels),
        "spec": spec,
        "env": dict(launch.env),
        "deadline_seconds": launch.deadline_seconds,
        "cwd": os.path.join(os.getcwd(), spec.get("cwd", "")),
        "log_bytes": log_bytes,
    }
    files: dict[str, Any] = {"launch.json": launch_doc, "labels.json": dict(launch.labels)}
    if (payload := launching.payload_json(launch.payload)) is not None:
        files[process_child.PAYLOAD_FILE] = payload
    return files


class _Lost(errors.ExecutorError):
    """The supervisor was gone before it answered: the launch may be asked again."""


class Supervisor:
    """This executor's end of its supervisor (process_shim.Supervisor): started at the
    first launch and again whenever it is found dead; a request per launch, and its
    answer; and the names of the runs whose commands it says ended."""

    def __init__(self) -> None:
        self.pid: int | None = None
        """The supervisor's pid, once it has said it."""
        self._sock: socket.socket | None = None
        self._ids = 0
        self._waiting: dict[int, asyncio.Future[str]] = {}
        self._names: dict[int, str] = {}  # request id -> run name, until its shim ends
        self._ended: dict[str, dict[str, Any] | None] = {}  # name -> exit record, if told
        self._unrecorded: set[str] = set()  # ended, and their exit never written
        self._news = asyncio.Event()
        self._heard_so_far = bytearray()  # the start of a line not yet whole
        self._starting: asyncio.Future[socket.socket] | None = None  # shared by the launches
        self._closed = False

    async def supervise(
        self,
        run_dir: Path,
        files: dict[str, Any],
        kill_grace: float,
        clk: clock.Clock,
        *,
        log: Path,
    ) -> str:
        """Have the supervisor make `run_dir` with `files` and start it; its answer,
        `started`, or `exists` when the name is there already. ExecutorError when it fails,
        or gives no answer in time. A request whose supervisor is found gone before it
        answered is asked once more of a new one: a launch is idempotent by name (the
        rename lets one through, and a second ask of a launched name answers `exists`)."""
        for last in (False, True):
            try:
                return await self._ask(run_dir, files, kill_grace, clk, log)
            except _Lost:
                if last:
                    raise
        raise AssertionError("unreachable")

    async def _ask(
        self, run_dir: Path, files: dict[str, Any], kill_grace: float, clk: clock.Clock, log: Path
    ) -> str:
        loop = asyncio.get_running_loop()
        self._ids += 1
        ask = self._ids
        answer: asyncio.Future[str] = loop.create_future()
        request = {"id": ask, "run": str(run_dir), "files": files, "grace": kill_grace}
        self._waiting[ask], self._names[ask] = answer, run_dir.name
        try:
            try:
                sock = await self._ready(log)
                sending = loop.sock_sendall(sock, json.dumps(request).encode() + b"\n")
                await asyncio.wait_for(sending, SHIM_ANSWER_SECONDS)
            except TimeoutError:
                self._lost("it took no request for too long")
                raise errors.ExecutorError(
                    f"process launch {run_dir.name!r}: the supervisor took no request in"
                    f" {SHIM_ANSWER_SECONDS:g}s"
                ) from None
            except OSError as exc:  # it died since the last request
                self._names.pop(ask, None)
                self._lost(f"its socket refused a request: {exc}")
                raise _Lost(f"process launch {run_dir.name!r}: {exc}") from exc
            until = clk.monotonic() + SHIM_ANSWER_SECONDS
            while not answer.done():
                if clk.monotonic() >= until:
                    raise errors.ExecutorError(
                        f"process launch {run_dir.name!r}: no answer in {SHIM_ANSWER_SECONDS:g}s"
                    )
                await asyncio.wait({answer}, timeout=0.5)
            return await answer
        finally:
            self._waiting.pop(ask, None)

    def take_ended(self) -> dict[str, dict[str, Any] | None]:
        """The names whose commands ended since the last call, each with its exit record
        as the supervisor put it in place (None: not told, read the folder)."""
        ended, self._ended = self._ended, {}
        self._news.clear()
        return ended

    def take_unrecorded(self) -> set[str]:
        """The names whose commands ended unrecorded since the last call."""
        unrecorded, self._unrecorded = self._unrecorded, set()
        return unrecorded

    def has_ended(self) -> bool:
        return bool(self._ended)

    async def wait_ended(self, clk: clock.Clock, seconds: float) -> None:
        """Until a command ends, or for `seconds` of `clk`."""
        news = asyncio.ensure_future(self._news.wait())
        pause = asyncio.ensure_future(clk.sleep(seconds))
        try:
            await asyncio.wait({news, pause}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            news.cancel()
            pause.cancel()

    async def _ready(self, log: Path) -> socket.socket:
        """The socket to a live supervisor, one started now if there is none (once for all
        the launches that ask meanwhile). One that died is seen as the end of its socket
        (nobody else holds its end)."""
        if self._sock is not None:
            return self._sock
        if self._starting is None or self._starting.done():
            self._starting = asyncio.ensure_future(self._start(log))
        return await asyncio.shield(self._starting)  # one launch given up: not the others'

    async def _start(self, log: Path) -> socket.socket:
        # In a thread: an interpreter's start takes a while, and the loop goes on meanwhile
        # (the other launches of the tick take their turns and wait here with this one).
        mine = await asyncio.to_thread(_start_supervisor, log)
        if self._closed:
            mine.close()
            raise errors.ExecutorError("process executor: closed; no more launches")
        mine.setblocking(False)
        asyncio.get_running_loop().add_reader(mine.fileno(), self._read)
        self._sock = mine
        self._heard_so_far = bytearray()
        return mine

    def _read(self) -> None:
        while (sock := self._sock) is not None:
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                return
            except OSError as exc:
                self._lost(f"its socket failed: {exc}")
                return
            if not data:
                self._lost("the supervisor is gone")
                return
            self._heard_so_far += data
            if b"\n" not in data:
                continue  # a long line (a run's output) comes in many reads: joined once
            *lines, rest = self._heard_so_far.split(b"\n")
            self._heard_so_far = bytearray(rest)
            for line in lines:
                try:
                    message = json.loads(line)
                except ValueError:
                    log.warning("process executor: the supervisor said %r", line[:200])
                    continue
                if isinstance(message, dict):
                    self._heard(message)

    def _heard(self, message: dict[str, Any]) -> None:
        if isinstance(supervisor := message.get("supervisor"), int):
            self.pid = supervisor
            log.info("process executor: supervisor started (pid %d)", supervisor)
            return
        ask = message.get("id")
        if not isinstance(ask, int):
            return
        name = self._names.get(ask)
        answer = self._waiting.get(ask)
        if answer is not None and not answer.done():
            if "error" in message:
                why = message["error"]
                answer.set_exception(errors.ExecutorError(f"process launch {name!r} failed: {why}"))
            elif message.get("answer") in ("started", "exists"):
                answer.set_result(message["answer"])
            elif message.get("ended"):
                answer.set_exception(errors.ExecutorError(f"process launch {name!r}: no answer"))
        if message.get("ended") and (name := self._names.pop(ask, None)) is not None:
            record = message.get("exit")
            if isinstance(record, dict) and isinstance(output := message.get("output"), dict):
                record = {**record, "output": output}
            self._ended[name] = record if isinstance(record, dict) else None
            if message.get("unrecorded"):
                self._unrecorded.add(name)
            self._news.set()
        elif "error" in message or message.get("answer") == "exists":
            self._names.pop(ask, None)  # no run: nothing will end

    def _lost(self, why: str) -> None:
        """The supervisor is gone: what waits for an answer is asked again of a new one.
        Runs already started are not touched: `events` sweeps them."""
        for ask, answer in list(self._waiting.items()):
            if not answer.done():
                name = self._names.pop(ask, None)
                answer.set_exception(_Lost(f"process launch {name!r}: no answer ({why})"))
        log.warning(
            "process executor: supervisor %s lost (%s); the next launch starts one",
            self.pid,
            why,
        )
        self.pid = None
        self._drop()

    def _drop(self) -> None:
        """Let go of the socket: a supervisor still there takes no more launches."""
        if self._sock is not None:
            with contextlib.suppress(Exception):  # a closed loop has no reader left to remove
                asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None

    async def close(self) -> None:
        self._closed = True
        self._drop()


def _start_supervisor(log: Path) -> socket.socket:
    """Start a supervisor (detached: its first process exits once the second is on its
    own); this end of the socket it reads."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with process_runs.os_errors("start the process executor's supervisor"):
            started = subprocess.run(
                [sys.executable, "-I", str(SHIM), "--supervisor", str(theirs.fileno()), str(log)],
                pass_fds=[theirs.fileno()],
                start_new_session=True,
                timeout=SHIM_ANSWER_SECONDS,
                check=False,
            )
        if started.returncode != 0:
            raise errors.ExecutorError(
                f"process executor: its supervisor did not start (exit {started.returncode})"
            )
    except subprocess.TimeoutExpired:
        mine.close()
        raise errors.ExecutorError("process executor: its supervisor did not start") from None
    except BaseException:
        mine.close()
        raise
    finally:
        theirs.close()
    return mine
