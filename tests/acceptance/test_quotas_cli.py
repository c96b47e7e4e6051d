"""The operator's command line is held to no tenant's quota, but says when it takes a
tenant past one: `corral submit --tenant`, `--from-file` and `corral schedules add
--tenant` as real processes, their warnings on stderr, `--json` on stdout still one JSON
document."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.cli import Run

SETTINGS = """
[tenants.acme]
max_queued = 2
max_schedules = 1
"""


def test_the_operator_passes_a_quota_and_is_warned(corral: Run, tmp_path: Path) -> None:
    (tmp_path / "corral.toml").write_text(SETTINGS)
    for _ in range(2):
        assert "warning" not in corral("submit", "--tenant", "acme", "--", "true").stderr
    over = corral("submit", "--tenant", "acme", "--json", "--", "true")
    assert json.loads(over.stdout) == {"id": 3, "created": True}
    assert over.stderr.strip() == (
        "warning: max_queued: tenant 'acme' now has 3 jobs waiting, over its quota of 2"
        " ([tenants.acme] max_queued); the operator is not held to it, but the tenant's own"
        " submits are refused until fewer wait"
    )
    assert "warning" not in corral("submit", "--", "true").stderr  # no tenant named

    lines = "\n".join(json.dumps({"spec": {"command": ["true"]}, "tenant": t}) for t in "ab")
    (tmp_path / "jobs.jsonl").write_text(
        f"{lines}\n" + json.dumps({"spec": {"command": ["true"]}, "tenant": "acme"})
    )
    batch = corral("submit", "--from-file", "jobs.jsonl", "--json")
    assert json.loads(batch.stdout)["created"] == 3
    [warned] = [line for line in batch.stderr.splitlines() if line.startswith("warning:")]
    assert "tenant 'acme' now has 4 jobs waiting" in warned

    made = corral("schedules", "add", "one", "--tenant", "acme", "--every", "1h", "--", "true")
    assert "warning" not in made.stderr
    two = corral("schedules", "add", "two", "--tenant", "acme", "--every", "1h", "--", "true")
    assert (
        "warning: max_schedules: tenant 'acme' now has 2 schedules, over its quota of 1"
        in two.stderr
    )
    listed = json.loads(corral("schedules", "list", "--tenant", "acme", "--json").stdout)
    assert sorted(s["name"] for s in listed) == ["one", "two"]
