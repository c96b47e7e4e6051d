"""corral's loops as people deploy them, each a real process on a real database: a
dispatcher alone runs a delayed job; `corral status` shows which loops live, and a killed
one gone (on this host) or stale (elsewhere)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import pytest

from corral import model, store
from tests.support import crash
from tests.support.crash import Site, stop
from tests.support.wait import eventually_sync

site = crash.site  # the fixture


def _job_state(url: str, job_id: int) -> model.JobState:
    async def read() -> model.JobState:
        db = store.Store.connect(url)
        try:
            return (await db.jobs.get(job_id=job_id)).state
        finally:
            await db.close()

    return asyncio.run(read())


def test_a_delayed_job_runs_with_only_a_dispatcher(site: Site) -> None:
    """No scheduler runs: the dispatcher's claim queues the job at its time and takes it."""
    made = site.corral("submit", "--delay", "1s", "--", "sh", "-c", "echo later")
    job_id = int(made.stdout.split()[-1])
    assert _job_state(site.url, job_id) == model.JobState.SCHEDULED
    dispatcher = site.start("dispatcher")
    try:
        eventually_sync(
            lambda: _job_state(site.url, job_id) == model.JobState.SUCCEEDED,
            what=f"job {job_id} succeeded",
        )
    finally:
        stop(dispatcher)
    shown = site.corral("jobs", "show", str(job_id))
    assert "its time came" in shown.stdout


HEARTBEAT = {"CORRAL_TIMEOUTS__HEARTBEAT_INTERVAL": "1s"}


def _status(site: Site) -> dict[str, Any]:
    shown: dict[str, Any] = json.loads(site.corral("status", "--all", "--json", **HEARTBEAT).stdout)
    return shown


def _state_of(site: Site, pid: int) -> str | None:
    return next((loop["state"] for loop in _status(site)["loops"] if loop["pid"] == pid), None)


def _elsewhere(site: Site, command: str) -> subprocess.Popen[str]:
    """`corral COMMAND` as if on another host: a UTS namespace of its own with another
    host name, so its liveness is judged by its beats alone, as a remote loop's is."""
    script = f"hostname elsewhere && exec {sys.executable} -m corral {command}"
    return subprocess.Popen(
        ["unshare", "--uts", "sh", "-c", script],
        cwd=site.root,
        env=site.env(**HEARTBEAT),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def test_status_shows_a_killed_loop_gone_here_and_stale_elsewhere(site: Site) -> None:
    if subprocess.run(["unshare", "--uts", "true"], check=False).returncode != 0:
        pytest.skip("unshare --uts is not allowed here (it needs root)")
    here = site.start("reconciler", **HEARTBEAT)
    there = _elsewhere(site, "dispatcher")
    try:
        eventually_sync(lambda: _state_of(site, here.pid) == "live", what="reconciler live")
        eventually_sync(lambda: _state_of(site, there.pid) == "live", what="dispatcher live")
        shown = {loop["pid"]: loop for loop in _status(site)["loops"]}
        assert shown[there.pid]["host"] == "elsewhere"
        assert (shown[there.pid]["kind"], shown[there.pid]["runs"]) == (
            "dispatcher",
            ["dispatcher"],
        )
        assert shown[here.pid]["kind"] == "reconciler"
    finally:
        for proc in (here, there):
            proc.kill()
            proc.wait()
    assert _state_of(site, here.pid) == "gone"  # this host sees its process is gone, at once
    # Elsewhere, its beats are all there is: live until three have passed, then stale.
    eventually_sync(lambda: _state_of(site, there.pid) == "stale", what="dispatcher stale")
    text = site.corral("status", **HEARTBEAT)
    assert "stale" in text.stdout
    assert "gone" not in text.stdout  # without --all: the live and the stale ones
