"""`corral jobs list` as a cron user runs it: what each job does, its schedule, its last
run and when it runs next, in the table and in --json; `--url` finds HTTP jobs by what
their URLs show, never by a secret in them, and a search too short to look for is named."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from tests.support.cli import Run

HOOK = "https://ops:hunter2@hooks.example.com/v1/ping?token=abc123&region=eu"
SHOWN = "https://[redacted]@hooks.example.com/v1/ping?token=[redacted]&region=eu"


def test_jobs_list_searches_urls_and_shows_what_each_job_does(corral: Run) -> None:
    at = (datetime.now(UTC) + timedelta(days=1)).replace(microsecond=0)
    hook = corral("submit", "--http", "POST", HOOK, "--at", at.isoformat()).stdout.strip()
    other = corral("submit", "--http", "GET", "https://status.test/").stdout.strip()
    command = corral("submit", "--", "echo", "hi").stdout.strip()

    found = json.loads(corral("jobs", "list", "--url", "HOOKS.example", "--json").stdout)
    assert [j["id"] for j in found] == [int(hook)]
    [job] = found
    assert job["target"] == {"kind": "http", "method": "POST", "url": SHOWN}
    assert job["state"] == "scheduled"
    assert datetime.fromisoformat(job["next_run"]) == at
    assert (job["schedule"], job["last_status"], job["response_time"]) == (None, None, None)
    for secret in ("hunter2", "abc123", "abc"):
        assert json.loads(corral("jobs", "list", "--url", secret, "--json").stdout) == [], secret
    every = json.loads(corral("jobs", "list", "--json").stdout)
    assert [j["id"] for j in every] == [int(command), int(other), int(hook)]
    assert every[0]["target"] == {"kind": "command", "command": "echo hi"}

    table = corral("jobs", "list").stdout
    for heading in ("what", "schedule", "last", "time", "next run"):
        assert heading in table
    assert "echo hi" in table
    assert "POST" in table
    assert "[redacted]" in table, "shown as it is, not read as markup"
    assert at.strftime("%m-%d %H:%M:%S") in table
    assert "hunter2" not in table
    assert "abc123" not in table

    short = corral("jobs", "list", "--url", "v1", check=False)
    assert short.returncode == 2
    assert "url: 'v1' is too short" in short.stderr
