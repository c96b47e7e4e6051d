"""`corral serve` started while its database cannot be reached, as a user runs it: it
tries again, one line a try, and runs once the database answers; or it gives up after
timeouts.database_wait and exits 1 with the last error. One-shot commands do not wait."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from tests.conftest import pg_empty
from tests.support.cli import corral_env, run_corral
from tests.support.net import free_port


class Proxy:
    """A TCP proxy on 127.0.0.1:`port` to `target`, listening only once `start` is called:
    until then, connections to its port are refused, as to a database that is down."""

    def __init__(self, port: int, target: tuple[str, int]) -> None:
        self.port, self.target = port, target
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    def start(self) -> None:
        self._thread.start()
        started = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._pipe, "127.0.0.1", self.port), self._loop
        )
        self._server = started.result(timeout=30)

    def close(self) -> None:
        if self._thread.is_alive():

            async def shut() -> None:
                if self._server is not None:
                    self._server.close()
                for task in asyncio.all_tasks():
                    if task is not asyncio.current_task():
                        task.cancel()

            asyncio.run_coroutine_threadsafe(shut(), self._loop).result(timeout=30)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
        self._loop.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        try:
            await asyncio.gather(self._copy(reader, up_writer), self._copy(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                w.close()

    @staticmethod
    async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(OSError):
            writer.write_eof()


@pytest.fixture
def proxy(pg_url: str) -> Iterator[Proxy]:
    real = make_url(pg_url)
    p = Proxy(free_port(), (real.host or "127.0.0.1", real.port or 5432))
    yield p
    p.close()


def env(database_url: str, **extra: str) -> dict[str, str]:
    return corral_env(
        {
            "CORRAL_DATABASE_URL": database_url,
            # On PostgreSQL a store call (2s to connect, at least) must fit in launch_grace.
            "CORRAL_TIMEOUTS__LAUNCH_GRACE": "5s",
            "COLUMNS": "500",  # a wide console: each log line stays on one line of stderr
            **extra,
        }
    )


def start_serve(
    tmp_path: Path, database_url: str, **extra: str
) -> tuple[subprocess.Popen[str], Path]:
    log = tmp_path / "serve.log"
    with open(log, "w") as err:  # a file never fills up and blocks the process
        proc = subprocess.Popen(
            [sys.executable, "-m", "corral", "serve", "--health-file", str(tmp_path / "health")],
            cwd=tmp_path,
            env=env(database_url, **extra),
            stdout=subprocess.DEVNULL,
            stderr=err,
            text=True,
        )
    return proc, log


def wait_until(
    predicate: Callable[[], object], seconds: float, what: str, proc: subprocess.Popen[str]
) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        assert proc.poll() is None, f"corral exited ({proc.returncode}) before {what}"
        time.sleep(0.1)
    raise AssertionError(f"not {what} after {seconds}s")


def stopped(proc: subprocess.Popen[str]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.postgres
@pytest.mark.slow
def test_serve_waits_for_the_database_then_runs_jobs(
    tmp_path: Path, pg_url: str, proxy: Proxy
) -> None:
    pg_empty(pg_url)
    through_proxy = make_url(pg_url).set(port=proxy.port).render_as_string(hide_password=False)
    server, log = start_serve(tmp_path, through_proxy)
    try:
        wait_until(lambda: "unreachable (try 3," in log.read_text(), 90, "tried 3 times", server)
        assert not (tmp_path / "health").exists(), "not ready while the database is down"
        proxy.start()
        wait_until(lambda: (tmp_path / "health").exists(), 90, "ready", server)
        submitted = run_corral(tmp_path, "submit", "--", "sh", "-c", "echo ran", env=env(pg_url))
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.strip()

        def succeeded() -> bool:
            shown = run_corral(tmp_path, "jobs", "show", job_id, "--json", env=env(pg_url))
            return json.loads(shown.stdout)["state"] == "succeeded"

        wait_until(succeeded, 90, "succeeded", server)
    finally:
        code = stopped(server)
    said = log.read_text()
    assert code == 0, said
    tries = [line for line in said.splitlines() if "database unreachable (try" in line]
    assert len(tries) >= 3
    first = tries[0]
    assert "database unreachable (try 1, waited 0.0s of 5m): database " in first
    assert f"127.0.0.1:{proxy.port}" in first
    assert "cannot be reached" in first
    assert "Connection refused; trying again in 0.5s" in first
    assert "trying again in 1.0s" in tries[1]
    assert "giving up" not in said


@pytest.mark.slow
def test_serve_gives_up_after_database_wait_and_exits_1_with_the_last_error(
    tmp_path: Path,
) -> None:
    nowhere = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/corral"
    began = time.monotonic()
    server, log = start_serve(tmp_path, nowhere, CORRAL_TIMEOUTS__DATABASE_WAIT="3s")
    try:
        code = server.wait(timeout=120)
    finally:
        stopped(server)
    took = time.monotonic() - began
    said = log.read_text()
    assert code == 1, said
    assert took < 60
    tries = [line for line in said.splitlines() if "database unreachable (try" in line]
    assert len(tries) >= 3  # at 0, 0.5s, 1.5s, then 3s
    assert "giving up (timeouts.database_wait)" in tries[-1]
    assert "waited 3.0s of 3s" in tries[-1]
    [error] = [line for line in said.splitlines() if line.startswith("error: ")]
    assert error.startswith(f"error: database {nowhere} cannot be reached: connection failed")
    assert "Connection refused" in error
    assert error.endswith(f"(tried {len(tries)} times in 3s, timeouts.database_wait)")
    assert "Traceback" not in said
    assert not (tmp_path / "health").exists()


@pytest.mark.slow
def test_a_stop_while_waiting_exits_cleanly(tmp_path: Path) -> None:
    nowhere = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/corral"
    server, log = start_serve(tmp_path, nowhere)
    try:
        wait_until(lambda: "unreachable (try 2," in log.read_text(), 90, "tried twice", server)
    finally:
        code = stopped(server)
    said = log.read_text()
    assert code == 0, said
    assert "stopped while waiting for the database" in said


def test_one_shot_commands_fail_at_once(tmp_path: Path) -> None:
    nowhere = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/corral"
    listed = run_corral(tmp_path, "jobs", "list", env=env(nowhere))
    assert listed.returncode == 1
    assert "cannot be reached" in listed.stderr
    assert "Connection refused" in listed.stderr
    assert "database unreachable" not in listed.stderr
