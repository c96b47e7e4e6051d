"""`corral schedules firings` as a user runs it, on a real SQLite file: a schedule fired by
`corral serve`, its firings a page at a time as a table and as the API's JSON, the next page
by --before, a bad --before or --limit refused naming it, and `schedules show` as before."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tests.support.cli import Run, corral_env
from tests.support.crash import stop
from tests.support.wait import PATIENCE


def test_the_firings_of_a_schedule_page_by_page(corral: Run, tmp_path: Path) -> None:
    corral("schedules", "add", "tick", "--every", "1s", "--", "sh", "-c", "exit 0")
    with open(tmp_path / "serve.log", "w") as log:  # a file never fills up and blocks
        proc = subprocess.Popen(
            [sys.executable, "-m", "corral", "serve"],
            cwd=tmp_path,
            env=corral_env(),
            stdout=subprocess.DEVNULL,
            stderr=log,
            text=True,
        )
    try:
        deadline = time.monotonic() + PATIENCE
        while time.monotonic() < deadline:
            page = json.loads(corral("schedules", "firings", "tick", "--json").stdout)
            done = [f for f in page["firings"] if f["job_state"] == "succeeded"]
            if len(done) >= 3:
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"not 3 firings succeeded: {page}")
    finally:
        stop(proc)
    row = done[0]
    assert set(row) == {
        "nominal_at", "outcome", "lateness", "job_id", "job_state", "status", "exit_code",
        "response_time", "note",
    }  # fmt: skip
    assert (row["outcome"], row["exit_code"], row["status"]) == ("fired", 0, None)
    assert row["lateness"] >= 0
    assert row["response_time"] > 0
    assert row["nominal_at"].endswith("Z")

    first = json.loads(corral("schedules", "firings", "tick", "--limit", "2", "--json").stdout)
    assert len(first["firings"]) == 2
    assert first["next"] == first["firings"][-1]["nominal_at"]
    older = corral(
        "schedules", "firings", "tick", "--limit", "2", "--before", first["next"], "--json"
    )
    after = json.loads(older.stdout)["firings"]
    assert after
    assert after[0]["nominal_at"] < first["next"]

    table = corral("schedules", "firings", "tick")  # the 20 latest: those seen above
    assert "NOMINAL (UTC)" in table.stdout
    assert "exit 0" in table.stdout
    assert "succeeded" in table.stdout
    short = corral("schedules", "firings", "tick", "--limit", "2")
    assert f"--before {first['next']}" in short.stderr  # how to ask for the older ones

    bad = corral("schedules", "firings", "tick", "--before", "yesterday", check=False)
    assert bad.returncode != 0
    assert "--before: 'yesterday' is not an ISO 8601 time" in bad.stderr
    too_many = corral("schedules", "firings", "tick", "--limit", "0", check=False)
    assert too_many.returncode != 0
    assert "--limit" in too_many.stderr
    missing = corral("schedules", "firings", "nope", check=False)
    assert missing.returncode != 0
    assert "no schedule named 'nope'" in missing.stderr
    shown = json.loads(corral("schedules", "show", "tick", "--json").stdout)
    assert shown["name"] == "tick"
    assert shown["firings"]
