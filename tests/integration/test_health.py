"""Health probes end to end: the loops call their hook after every round, a real `corral
serve` keeps its health file fresh, and `corral health` fails when a loop stops moving
(the process frozen with SIGSTOP), when the file is missing, or when it is stale."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from corral import config, dispatcher, errors, reconciler, store
from corral.testing import PausedClock
from tests.support.cli import corral_env, run_corral
from tests.support.noop import NoopExecutor
from tests.support.wait import PATIENCE, eventually_sync

pytestmark = [pytest.mark.slow, pytest.mark.timeout(6 * PATIENCE)]


async def test_each_loop_calls_its_hook_after_every_round_failed_ones_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'corral.db'}"
    db = store.Store.connect(url)
    await db.database.migrate()

    async def unreachable(**_: Any) -> Any:
        raise errors.StoreError("the database cannot be reached")

    monkeypatch.setattr(db.jobs, "claim", unreachable)
    monkeypatch.setattr(db.attempts, "list_for_recovery", unreachable)
    parts: dict[str, Any] = {
        "store": db,
        "executors": {"noop": NoopExecutor()},
        "clock": PausedClock(),  # the loops' own sleeps must not move time
        "settings": config.Settings(database_url=url),
    }
    rounds = {"dispatcher": 0, "reconciler": 0}
    stop = asyncio.Event()

    def hook(loop: str) -> Any:
        def count() -> None:
            rounds[loop] += 1
            if min(rounds.values()) >= 3:
                stop.set()

        return count

    try:
        await asyncio.wait_for(
            asyncio.gather(
                dispatcher.Dispatcher(**parts).run(stop, on_tick=hook("dispatcher")),
                reconciler.Reconciler(**parts).run(stop, on_pass=hook("reconciler")),
            ),
            timeout=PATIENCE,
        )
    finally:
        await db.close()
    assert min(rounds.values()) >= 3, rounds


# --- a real corral process ------------------------------------------------------------------------


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    upgraded = run_corral(tmp_path, "db", "upgrade")
    assert upgraded.returncode == 0, upgraded.stderr
    return tmp_path


@pytest.fixture
def running(folder: Path) -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test starts; each is stopped (SIGCONT, then SIGKILL) if still running."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.communicate(timeout=PATIENCE)


def start(
    folder: Path,
    running: list[subprocess.Popen[str]],
    *args: str,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral", *args],
        cwd=folder,
        env=corral_env(env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    running.append(proc)
    return proc


def times(
    path: Path, proc: subprocess.Popen[str], after: dict[str, datetime] | None = None
) -> dict[str, datetime]:
    """The loops' times in the health file, once it is there (and, with `after`, once every
    loop has finished a round since those times)."""

    def found() -> dict[str, datetime] | None:
        assert proc.poll() is None, f"corral exited {proc.returncode}"
        if not path.exists():
            return None
        loops = {
            k: datetime.fromisoformat(v) for k, v in json.loads(path.read_text())["loops"].items()
        }
        if after is not None and not all(loops[k] > at for k, at in after.items()):
            return None
        return loops

    loops: dict[str, datetime] = eventually_sync(found, every=0.1, what=f"the health file {path}")
    return loops


def test_serve_keeps_its_health_file_fresh_and_health_sees_a_frozen_process(
    folder: Path, running: list[subprocess.Popen[str]]
) -> None:
    path = folder / "run" / "health.json"
    proc = start(folder, running, "serve", "--health-file", str(path))
    first = times(path, proc)
    assert set(first) == {"dispatcher", "reconciler", "scheduler", "alerter"}
    ready = run_corral(folder, "health", "--file", str(path), "--ready")
    assert ready.returncode == 0, ready.stderr
    assert ready.stdout.startswith("ok: dispatcher tick")
    later = times(path, proc, after=first)  # rewritten as the loops go on
    assert all(later[loop] > first[loop] for loop in first), (first, later)
    alive = run_corral(folder, "health", "--file", str(path), "--max-age", "30s")
    assert alive.returncode == 0, alive.stderr

    os.kill(proc.pid, signal.SIGSTOP)  # every loop stops moving, the file stays

    def health(*args: str) -> subprocess.CompletedProcess[str]:
        return run_corral(folder, "health", "--file", str(path), *args)

    def stale() -> subprocess.CompletedProcess[str] | None:
        checked = health("--max-age", "2s")
        return checked if checked.returncode == 1 else None

    stuck = eventually_sync(stale, what="the file taken for stale")  # it only ages now
    assert "ago" in stuck.stderr
    assert "the loop is stuck" in stuck.stderr
    assert health("--ready").returncode == 0

    os.kill(proc.pid, signal.SIGCONT)
    eventually_sync(
        lambda: health("--max-age", "2s").returncode == 0, what="the file freshened after SIGCONT"
    )
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=PATIENCE) == 0
    assert path.exists(), "a clean stop leaves the file: removing it would fail a draining pod"


def test_a_reconciler_alone_takes_its_health_file_from_the_environment(
    folder: Path, running: list[subprocess.Popen[str]]
) -> None:
    path = folder / "health.json"
    env = {"CORRAL_HEALTH_FILE": str(path)}
    proc = start(folder, running, "reconciler", env=env)
    assert set(times(path, proc)) == {"reconciler"}
    checked = run_corral(folder, "health", "--max-age", "30s", env=corral_env(env))
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.startswith("ok: reconciler pass")


def test_a_restarted_corral_is_not_ready_until_its_own_first_round(
    folder: Path, running: list[subprocess.Popen[str]]
) -> None:
    path = folder / "health.json"
    path.write_text(json.dumps({"pid": 1, "loops": {"dispatcher": "2020-01-01T00:00:00+00:00"}}))
    old = run_corral(folder, "health", "--file", str(path))
    assert old.returncode == 1
    assert "dispatcher's last tick ended" in old.stderr
    proc = start(folder, running, "dispatcher", "--health-file", str(path))
    eventually_sync(
        lambda: json.loads(path.read_text() if path.exists() else "{}").get("pid") == proc.pid,
        what="the earlier run's file replaced",
    )
    assert run_corral(folder, "health", "--file", str(path)).returncode == 0


def test_health_fails_clearly_on_a_missing_file_or_none_configured(folder: Path) -> None:
    missing = run_corral(folder, "health", "--file", str(folder / "nowhere.json"))
    assert missing.returncode == 1
    assert "no health file" in missing.stderr
    assert "--health-file" in missing.stderr
    unset = run_corral(folder, "health")
    assert unset.returncode == 2
    assert "give --file PATH or set health_file" in unset.stderr
    bad = run_corral(folder, "health", "--file", "x", "--max-age", "soon")
    assert bad.returncode == 2
    assert "--max-age" in bad.stderr
