"""Real corral processes killed with SIGKILL at random moments, over and over, then let
finish: every job still ends exactly once, nothing runs twice, nothing is left stuck."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.crash import Report, Site, run_to_the_end, seeded, stop

JOBS = 200
KILLS = 12


def figures(report: Report, kills: int) -> dict[str, int]:
    found = {
        "jobs": len(report.jobs),
        "kills": kills,
        "attempts": len(report.attempts),
        "relaunches": report.count("relaunched"),
        "adoptions": report.count("adopted"),
        "lost": sum(1 for a in report.attempts if a.state == "lost"),
    }
    print("chaos figures:", json.dumps(found))
    return found


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_serve_killed_at_random_moments(tmp_path: Path, db_url: str) -> None:
    rnd = seeded()
    site = Site(tmp_path, db_url)
    ids = site.submit(JOBS, sleep=0.1)
    for _ in range(KILLS):
        proc = site.start()
        time.sleep(rnd.uniform(1.2, 3.0))  # python needs ~1s to start
        proc.kill()
        proc.wait()
    report = run_to_the_end(site, ids, "serve")
    found = figures(report, KILLS)
    assert_each_job_ran_once(site, report, found)


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.timeout(400)
def test_two_dispatchers_and_a_reconciler_killed_independently(tmp_path: Path, pg_url: str) -> None:
    from tests.conftest import pg_empty

    pg_empty(pg_url)
    rnd = seeded()
    site = Site(tmp_path, pg_url)
    ids = site.submit(JOBS, sleep=0.1)
    roles = ["dispatcher", "dispatcher", "reconciler"]
    procs: list[subprocess.Popen[str]] = [site.start(r) for r in roles]
    kills = 0
    while kills < KILLS:
        time.sleep(rnd.uniform(0.1, 0.8))
        victim = rnd.randrange(len(procs))
        procs[victim].kill()
        procs[victim].wait()
        kills += 1
        procs[victim] = site.start(roles[victim])
    for p in procs:
        stop(p)
    report = run_to_the_end(site, ids, "dispatcher", "dispatcher", "reconciler")
    found = figures(report, kills)
    assert_each_job_ran_once(site, report, found)


def assert_each_job_ran_once(site: Site, report: Report, found: dict[str, int]) -> None:
    """These jobs never fail, so any second attempt or second run is a duplicate."""
    assert found["lost"] == 0, "nothing here outlives recovery_grace"
    assert found["attempts"] == JOBS, "one attempt a job: no retry was needed"
    assert sorted(j for j, _, _ in site.ledger_entries()) == sorted(j.id for j in report.jobs)
