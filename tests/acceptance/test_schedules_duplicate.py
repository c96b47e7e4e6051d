"""`corral schedules duplicate NAME NEW` as a user runs it, on a real SQLite file: the copy
has the schedule's rule, options and request (its secret too, never printed), a name
taken or another tenant's schedule is refused."""

from __future__ import annotations

import json

from tests.support.cli import Run


def test_a_schedule_is_copied_under_a_new_name(corral: Run) -> None:
    corral(
        "schedules", "add", "ping", "--tenant", "acme", "--every", "10m", "--jitter", "5s",
        "--http", "GET", "https://example.com/health?token=s3cret", "--header",
        "Authorization: Bearer s3cret", "--expect", "200", "--label", "team=ops",
    )  # fmt: skip
    copied = corral("schedules", "duplicate", "ping", "ping-2", "--tenant", "acme", "--json")
    copy = json.loads(copied.stdout)
    original = json.loads(corral("schedules", "show", "ping", "--tenant", "acme", "--json").stdout)
    mine = ("id", "name", "created_at", "updated_at", "next_due", "upcoming", "firings")
    assert {k: v for k, v in copy.items() if k not in mine} == {
        k: v for k, v in original.items() if k not in mine
    }
    assert (copy["name"], copy["tenant"], copy["every_seconds"]) == ("ping-2", "acme", 600)
    assert copy["template"]["spec"]["headers"] == {"Authorization": "[redacted]"}
    assert "s3cret" not in copied.stdout
    said = corral("schedules", "duplicate", "ping", "ping-3", "--tenant", "acme")
    assert said.stdout.strip() == "ping-3"
    assert "schedule 'ping-3' made (a copy of 'ping'); it fires next at" in said.stderr
    taken = corral("schedules", "duplicate", "ping", "ping-2", "--tenant", "acme", check=False)
    assert taken.returncode == 2
    assert "name: a schedule named 'ping-2' exists" in taken.stderr
    elsewhere = corral("schedules", "duplicate", "ping", "ping-4", check=False)  # tenant default
    assert elsewhere.returncode == 1
    names = json.loads(corral("schedules", "list", "--json").stdout)
    assert sorted(s["name"] for s in names) == ["ping", "ping-2", "ping-3"]
