"""The benchmarks run: each one, on a few jobs, prints the JSON the performance page reads.

Numbers are not checked here (a test machine is noisy; the ratios are what bench/ is for):
only that every benchmark still runs against the code as it is, on both databases."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import _pg_admin_url

ROOT = Path(__file__).parents[2]
pytestmark = pytest.mark.postgres


def _bench(script: str, *args: str, server: bool = True) -> Any:
    """Run bench/`script` with `args`, against the test server unless not `server` (it
    makes and drops databases of its own there); its JSON report."""
    if server:
        pg = _pg_admin_url()
        if pg is None:
            pytest.skip("PostgreSQL unreachable; skipped locally, fails on CI")
        args = (*args, "--pg-url", pg)
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_throughput_reports_both_databases() -> None:
    report = _bench("throughput.py", "--jobs", "300", "--big", "3000", "--samples", "50")
    for kind in ("sqlite", "postgres"):
        got = report[kind]
        assert got["corral"]["dispatch_complete_jobs_per_s"] > 0
        assert got["ratio_corral_vs_raw_same_writes"] > 0
        assert got["claim_latency"]["p99_ratio_big_queued_vs_10k"] > 0
        assert got["rss_big_queue"]["dispatcher_max_rss_mb"] > 0
    assert report["postgres"]["corral"]["round_trips_per_tick"] > 0  # counted (a few ticks
    # of 300 jobs and a poll or two: not the figure of a real run, which bench/ is for)


def test_recovery_reports_every_scenario() -> None:
    report = _bench("recovery.py", "--n", "20")
    for kind in ("sqlite", "postgres"):
        assert all(scenario["within_target"] for scenario in report[kind].values()), report


def test_retry_storm_reports_with_and_without_a_budget() -> None:
    report = _bench("retry_storm.py", "--jobs", "50", "--attempts", "2", server=False)
    assert report["with_budget"]["seconds_until_every_job_ended"] > 0
    assert report["without_budget"]["retries_in_first_minute"] == 50  # one retry each


@pytest.mark.skipif(
    importlib.util.find_spec("pgqueuer") is None,
    reason="PgQueuer is in the bench extra (pip install -e '.[bench]')",
)
def test_peers_reports_ratios() -> None:
    report = _bench("peers.py", "--jobs", "300", "--rounds", "1")
    assert report["median"]["ratio_corral_vs_pgqueuer_best"] > 0


def test_process_reports_the_ratio_to_a_bare_loop() -> None:
    report = _bench("process.py", "--jobs", "40", "--rounds", "1", server=False)
    assert report["median_jobs_per_s"]["corral"] > 0
    assert report["ratio_corral_vs_bare"] > 0
    assert report["create_us_median"]["disk"] > 0


def test_http_jobs_report_the_ratio_to_a_bare_httpx_loop() -> None:
    report = _bench("http_jobs.py", "--jobs", "40", "--rounds", "1", server=False)
    assert report["median_requests_per_s"]["corral"] > 0
    assert report["ratio_corral_vs_bare"] > 0


def test_alerts_report_the_noise_and_the_ratio_with_the_alerter_on() -> None:
    report = _bench(
        "alerts.py", "--quarantines", "50", "--jobs", "60", "--rounds", "1", server=False
    )
    assert report["noise"]["messages_per_channel"] == {"hook": 2, "slack": 2}
    assert report["ratio_on_vs_off"] > 0


def test_history_reports_serve_and_a_pass_at_two_sizes() -> None:
    report = _bench(
        "history.py",
        *("--small", "20", "--big", "60", "--settle", "0.5", "--passes", "2"),
        server=False,
    )
    assert report["big"]["finished_runs"] == 60
    assert report["ratio_serve_rss_big_vs_small"] > 0
    assert report["ratio_pass_big_vs_small"] > 0


def test_cli_start_reports_each_command_and_bulk_submit() -> None:
    report = _bench("cli_start.py", "--runs", "1", "--bulk", "50", server=False)
    assert report["start"]["ratio_help_vs_import_click"] > 0
    assert report["start"]["median_ms"]["heartbeat"] > 0
    assert report["bulk"]["ratio_bulk_file_vs_client_loop"] > 0


def test_schedules_reports_lateness_duplicates_and_scaling() -> None:
    report = _bench("schedules.py", "--schedules", "40", "--paused", "100", "--lead", "2")
    for kind in ("sqlite", "postgres"):
        got = report[kind]
        assert got["one_scheduler"]["fired"] == 40
        assert got["three_schedulers"]["fired"] == 40
        assert got["three_schedulers"]["duplicates"] == 0
        assert got["one_scheduler"]["claimable_after_s"]["p99"] is not None
        assert got["ratio_all_vs_tenth_due"] > 0
        assert got["ratio_over_paused_vs_alone"] > 0


def test_api_reports_each_page_against_its_bare_sql() -> None:
    report = _bench(
        "api.py", "--jobs", "2000", "--events", "10000", "--requests", "10", "--clients", "2"
    )
    assert set(report["pages"]) == {"state", "state_queue", "label", "job"}
    for page in report["pages"].values():
        assert page["ratio_p95_api_vs_bare"] > 0
    assert report["api_server"]["cpu_ms_per_request"] > 0


def test_job_search_reports_each_filter_s_first_page() -> None:
    report = _bench("job_search.py", "--jobs", "2000", "--schedules", "20")
    assert len(report["filters"]) >= 10
    for name, read in report["filters"].items():
        assert read["buffers"] > 0, name
        assert read["indexes"], name
    assert "ix_jobs_schedule" in report["filters"]["schedule"]["indexes"]


def test_dashboard_reports_each_page_against_its_own_sql_or_as_missing() -> None:
    """Every page of the table is timed (each request answered 200, or the run stops) or
    listed as missing: not there yet (404), or its filter not read yet (200, the statements
    of the page without it). A cron page is timed beside its own statements run bare."""
    report = _bench(
        "dashboard.py",
        *("--jobs", "2000", "--events", "10000", "--schedules", "50", "--firings", "1000"),
        *("--clients", "2", "--requests", "20", "--alone", "2"),
    )
    overviews = {"overview", "overview_one_tenant", "overview_cold", "overview_one_tenant_cold"}
    cron = {
        *("jobs", "jobs_state", "jobs_queue", "jobs_label", "jobs_url", "jobs_schedule"),
        *("jobs_schedule_big", "schedules", "schedules_one_tenant", "schedules_after"),
        *("schedule", "schedule_older"),
    }
    missing = {m["page"]: m for m in report["missing"]}
    assert {m["status"] for m in missing.values()} <= {200, 404}, missing
    assert set(report["pages"]) | set(missing) == {*overviews, *cron, "api_jobs", "healthz"}
    assert not set(report["pages"]) & set(missing)
    assert {"api_jobs", "healthz", "jobs", "jobs_state", "schedules"} <= set(report["pages"])
    for name, page in report["pages"].items():
        assert page["requests"] > 0, name
        assert page["ms"]["p95"] > 0, name
        if name in cron:
            assert page["statements"] > 0, name
            assert page["ratio_p95_vs_bare"] > 0, name
        if name in overviews:
            assert page["ratio_p95_vs_api_list"] > 0, name
    assert report["loaded"]["rows"]["jobs"] == 2000
    assert report["loaded"]["rows"]["schedules"] == 50
    assert report["server"]["cpu_ms_per_request"] > 0
    assert report["load_s"] > 0
    assert report["run_s"] > 0


def test_workers_report_the_ratio_to_the_dispatcher_and_the_parked_backlog() -> None:
    report = _bench("workers.py", "--jobs", "300", "--backlog", "200")
    got = report["throughput"]
    assert got["workers"]["succeeded"] == got["dispatcher"]["succeeded"] == 300
    assert sum(got["workers"]["jobs_by_worker"]) == 300
    assert got["ratio_workers_vs_dispatcher"] > 0
    backlog = report["parked_backlog"]
    assert backlog["in_process"]["register_s"] > 0
    assert backlog["worker_process"]["from_registration_to_all_ran_s"] > 0


@pytest.mark.skipif(
    importlib.util.find_spec("pgqueuer") is None,
    reason="bench/peers.py needs PgQueuer, in the bench extra (pip install -e '.[bench]')",
)
def test_before_after_compares_two_trees_in_turns() -> None:
    report = _bench(
        "before_after.py", "--before", str(ROOT), "--after", str(ROOT), "--rounds", "1",
        "--jobs", "200",
    )  # fmt: skip
    assert len(report["corral_jobs_per_s"]["before"]) == 1
    assert report["median"]["after"] > 0
    assert report["ratio_after_vs_before"] > 0


def test_monitors_reports_pings_a_second_beside_a_bare_insert() -> None:
    report = _bench("monitors.py", "--monitors", "20", "--clients", "2", "--requests", "20")
    assert report["corral"]["statuses"] == {"200": 40}  # none past its 10 pings a second
    assert report["bare_insert"]["pings_per_s"] > 0
    assert report["ratio_pings_per_s_corral_vs_bare"] > 0
