"""`corral jobs bulk retry|cancel|discard` as a user runs it: the preview first (how many,
which), a question unless --yes, then the operation on that snapshot until it has ended."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.cli import Run, run_corral


def test_a_bulk_cancel_previews_asks_and_acts(corral: Run, tmp_path: Path) -> None:
    ids = [
        json.loads(corral("submit", "--json", "--queue", "bulk", "--", "true").stdout)["id"]
        for _ in range(3)
    ]
    corral("submit", "--queue", "other", "--", "true")
    declined = run_corral(tmp_path, "jobs", "bulk", "cancel", "--queue", "bulk", stdin="n\n")
    assert declined.returncode == 1
    assert f"cancel would touch 3 jobs: {ids[2]}, {ids[1]}, {ids[0]}" in declined.stderr
    done = json.loads(corral("jobs", "bulk", "cancel", "--queue", "bulk", "--yes", "--json").stdout)
    assert (done["state"], done["total"], done["applied"], done["skipped"]) == (
        "succeeded",
        3,
        3,
        0,
    )
    listed = json.loads(corral("jobs", "list", "--json", "--state", "cancelled").stdout)
    assert sorted(j["id"] for j in listed) == sorted(ids)


def test_a_bulk_action_refuses_a_state_it_never_touches(corral: Run) -> None:
    refused = corral("jobs", "bulk", "retry", "--state", "queued", "--yes", check=False)
    assert refused.returncode == 2
    assert "--state" in refused.stderr
    assert "touches quarantined jobs" in refused.stderr
