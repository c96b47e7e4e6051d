"""`corral tenants list | show` as the operator runs them, in a subprocess on a real SQLite
file: every tenant corral knows, each quota with its limit and its use, and its weight; and
a job whose run log was trimmed for its tenant's run_log_bytes says so in `jobs show` and
`jobs logs`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from corral import clock, launching, model, store
from corral.store import Finish
from tests.support.cli import Run

SETTINGS = """
[tenants."*"]
run_log_bytes = 1048576

[tenants.acme]
weight = 2
max_queued = 50
max_running = 4
"""


def test_tenants_are_listed_and_shown_with_their_quotas_and_use(
    corral: Run, tmp_path: Path
) -> None:
    (tmp_path / "corral.toml").write_text(SETTINGS)
    for _ in range(2):
        corral("submit", "--tenant", "acme", "--", "true")
    corral("tokens", "create", "--tenant", "beta", "--role", "viewer")
    listed = json.loads(corral("tenants", "list", "--json").stdout)
    assert [(t["tenant"], t["weight"]) for t in listed] == [("acme", 2.0), ("beta", 1.0)]
    acme = json.loads(corral("tenants", "show", "acme", "--json").stdout)
    assert acme == listed[0]
    assert acme["quotas"] == {
        "max_running": {"limit": 4, "use": 0},
        "max_queued": {"limit": 50, "use": 2},
        "max_schedules": {"limit": 1000, "use": 0},
        "max_monitors": {"limit": 100, "use": 0},
        "submit_rate": {"limit": 6000, "use": 0.0},  # the operator's submits draw on none
        "max_payload_bytes": {"limit": 1048576, "use": None},
        "run_log_bytes": {"limit": 1048576, "use": 0},
    }
    assert listed[1]["quotas"]["max_running"] == {"limit": None, "use": 0}
    table = corral("tenants", "list").stdout
    assert "acme" in table
    assert "2/50" in table
    shown = corral("tenants", "show", "acme").stdout
    assert "tenant acme  weight 2" in shown
    assert "max_queued" in shown
    assert "4%" in shown  # 2 of 50 waiting
    gone = corral("tenants", "show", "nobody", check=False)
    assert gone.returncode == 1
    assert "error: no tenant 'nobody'" in gone.stderr


async def _succeed_and_trim(url: str, job_id: int) -> None:
    """Job `job_id` claimed and succeeded with output, then its log trimmed, as the
    reconciler trims a tenant over its run_log_bytes."""
    db = store.Store.connect(url)
    now = clock.SystemClock().now()  # the command submitted the job due now
    [c] = await db.jobs.claim(now=now, limit=1, executors=["process"])
    assert c.job.id == job_id
    output = launching.RunLog(streams=(launching.Stream("stdout", "hello\n", 6),))
    won = Finish(c.attempt.id, model.AttemptState.SUCCEEDED, 0, None, output=output)
    await db.attempts.settle(launched=[], finishes=[won], now=now)
    done = await db.runlogs.trim(tenant="acme", over=1, limit=10, now=now)
    assert done.jobs == (job_id,)
    await db.close()


def test_a_job_whose_log_was_trimmed_says_so(corral: Run, tmp_path: Path) -> None:
    job_id = int(corral("submit", "--tenant", "acme", "--", "echo", "hello").stdout.split()[-1])
    asyncio.run(_succeed_and_trim(f"sqlite:///{tmp_path / 'corral.db'}", job_id))
    shown = corral("jobs", "show", str(job_id)).stdout
    assert "output: trimmed to keep its tenant under its run_log_bytes quota" in shown
    logs = corral("jobs", "logs", str(job_id)).stdout
    assert "(output trimmed to keep its tenant under its run_log_bytes quota" in logs
    [part] = json.loads(corral("jobs", "logs", str(job_id), "--json").stdout)
    assert part["stream"] is None
    assert part["trimmed_at"] is not None
    data = json.loads(corral("jobs", "show", str(job_id), "--json").stdout)
    assert data["attempt_list"][0]["output_trimmed_at"] == part["trimmed_at"]
