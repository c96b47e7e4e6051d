"""Crash at each named failpoint, restart, and show every job still ends exactly once."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral import failpoints
from tests.support.crash import Site, run_to_the_end, wait_exit

JOBS = 3


@pytest.fixture
def site(db_url: str, tmp_path: Path) -> Site:
    return Site(tmp_path, db_url)


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
