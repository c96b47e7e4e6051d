"""Crash at each named failpoint, restart, and show every job still ends exactly once."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from corral import failpoints
from tests.support import crash
from tests.support.crash import Report, Site, run_to_the_end, stop, wait_exit
from tests.support.procs import alive
from tests.support.wait import eventually_sync

JOBS = 3


site = crash.site  # the fixture


def crash_at(site: Site, name: str) -> None:
    proc = site.start(CORRAL_FAILPOINTS=f"{name}:crash")
    assert wait_exit(proc, 60) == failpoints.CRASH_EXIT_CODE, f"did not crash at {name}"


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize(
    "name", ["after_claim_commit", "after_launch", "before_record_running", "mid_completion"]
)
def test_crash_at_a_failpoint_then_restart(site: Site, name: str) -> None:
    ids = site.submit(JOBS)
    crash_at(site, name)
    report = run_to_the_end(site, ids)
    assert all(j.state == "succeeded" for j in report.jobs)
    assert sorted(j for j, _, _ in site.ledger_entries()) == sorted(ids), "each job ran once"


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_crash_in_the_middle_of_a_reconciler_repair(site: Site) -> None:
    ids = site.submit(JOBS)
    crash_at(site, "after_claim_commit")  # leaves attempts launching with nothing launched
    proc = site.start("reconciler", CORRAL_FAILPOINTS="mid_repair:crash")
    assert wait_exit(proc, 60) == failpoints.CRASH_EXIT_CODE  # relaunched, not yet recorded
    runs = site.root / "state" / "runs"
    assert len([d for d in runs.iterdir() if not d.name.startswith(".")]) == JOBS  # relaunched
    report = run_to_the_end(site, ids)
    # The unrecorded relaunches were found and finished, not launched a third time or retried.
    assert [a.attempt_no for a in report.attempts] == [1] * JOBS
    assert all(j.state == "succeeded" for j in report.jobs)


COPY = textwrap.dedent(
    """
    import fcntl, os, sys, time
    folder = sys.argv[1]
    job, attempt, fence = (os.environ[f"CORRAL_{k}"] for k in ("JOB_ID", "ATTEMPT", "FENCE"))
    lock = os.open(os.path.join(folder, f"lock-{job}"), os.O_WRONLY | os.O_CREAT, 0o644)
    try:  # held while this copy lives: a second copy of the job cannot take it
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        company = "alone"
    except BlockingIOError:
        company = "beside another copy"
    with open(os.path.join(folder, "ledger.txt"), "a") as ledger:
        ledger.write(f"{job},{attempt},{fence},{os.getpid()},{company}\\n")
    # Alive until the test releases it (or kills it, failing): a copy that ended by itself
    # before its relaunch started, as on a slow machine after 60s, would hide a second copy.
    until = time.monotonic() + 600
    while not os.path.exists(os.path.join(folder, "release")) and time.monotonic() < until:
        time.sleep(0.05)
    """
)


def copies(site: Site) -> list[list[str]]:
    """The ledger's lines: job, attempt, fence, pid, and whether another copy was alive."""
    return [line.split(",") for line in site.ledger.read_text().splitlines()]


def stop_strays(site: Site) -> None:
    """SIGKILL the copies of the test's jobs still running (the test failed)."""
    for _, _, _, pid, _ in copies(site):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if str(site.root).encode() in cmdline:
            os.kill(int(pid), signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("supervisors", ["alive", "killed"])
def test_a_run_folder_deleted_while_corral_is_down_never_leaves_two_copies_of_an_attempt(
    site: Site, supervisors: str
) -> None:
    """The launches are made, corral dies before it records them as running, and their run
    folders are deleted while it is down: recovery relaunches each attempt under its own
    name and fence, and its earlier copy must be dead by then, never running beside it.
    With their supervisors killed too, the commands are orphans only the relaunch can find."""
    script = site.root / "one_copy_at_a_time.py"
    script.write_text(COPY)
    ids = site.submit_shell(JOBS, shlex.join([sys.executable, str(script), str(site.root)]))
    crash_at(site, "before_record_running")
    try:
        eventually_sync(
            lambda: len(copies(site)) == JOBS, within=60, what="every first copy started"
        )
        for run_dir in (site.root / "state" / "runs").iterdir():
            if run_dir.name.startswith("."):
                continue  # the indexes of live and ended runs: hints, left stale here
            if supervisors == "killed":
                shim = json.loads((run_dir / "shim.pid").read_text())["pid"]
                os.kill(shim, signal.SIGKILL)
                eventually_sync(lambda pid=shim: not alive(pid), what=f"supervisor {shim} dead")
            shutil.rmtree(run_dir)
        corral = site.start()
        try:
            eventually_sync(
                lambda: len(copies(site)) == 2 * JOBS, within=120, what="every attempt relaunched"
            )
            (site.root / "release").touch()
            eventually_sync(
                lambda: Report(site.url, ids).all_final(),
                within=120,
                every=0.2,
                what="all jobs final",
            )
        finally:
            stop(corral)
    finally:
        (site.root / "release").touch()
        stop_strays(site)
    report = Report(site.url, ids)
    assert all(j.state == "succeeded" for j in report.jobs)
    assert [a.attempt_no for a in report.attempts] == [1] * JOBS, "relaunched, not retried"
    fences = {str(a.job_id): str(a.id) for a in report.attempts}
    assert sorted(job for job, *_ in copies(site)) == sorted(map(str, ids * 2))
    assert all(fence == fences[job] for job, _, fence, _, _ in copies(site)), "one fence a job"
    together = [line for line in copies(site) if line[4] != "alone"]
    assert together == [], "two copies of one attempt were alive at once"
