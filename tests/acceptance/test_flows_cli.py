"""`corral flows` as the operator runs it for a tenant, in a subprocess on a real SQLite file:
made, listed and shown (`--json`), changed, named by a job (and refused when the tenant has
no such flow), kept while a job of it waits, and deleted; another tenant's is apart; a hold
that has ended is not shown."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import create_engine

from corral.store import tables
from tests.support.cli import Run


def test_the_operator_makes_shows_changes_and_deletes_a_tenant_s_flows(corral: Run) -> None:
    made = corral("flows", "add", "stripe", "--tenant", "acme", "--rate", "10/1s", "--json")
    assert json.loads(made.stdout)["rate"] == "10/1s"
    said = corral("flows", "add", "stripe", "--tenant", "beta", "--parallelism", "2").stdout
    assert "flow stripe of tenant beta made: no rate, parallelism 2" in said
    bad = corral("flows", "add", "x", "--tenant", "acme", "--rate", "10/week", check=False)
    assert bad.returncode == 2
    assert "rate: 'week' is not a duration" in bad.stderr
    listed = json.loads(corral("flows", "list", "--tenant", "acme", "--json").stdout)
    assert [(f["name"], f["rate"], f["parallelism"]) for f in listed] == [("stripe", "10/1s", None)]
    changed = corral("flows", "update", "stripe", "--tenant", "acme", "--parallelism", "3").stdout
    assert "flow stripe of tenant acme changed: rate 10/1s, parallelism 3" in changed

    refused = corral("submit", "--tenant", "acme", "--flow", "paypal", "--", "true", check=False)
    assert refused.returncode == 2
    assert "flow: tenant 'acme' has no flow named 'paypal'" in refused.stderr
    corral("submit", "--tenant", "acme", "--flow", "stripe", "--", "true")
    shown = json.loads(corral("flows", "show", "stripe", "--tenant", "acme", "--json").stdout)
    assert (shown["running"], shown["started_in_window"], shown["parallelism"]) == (0, 0, 3)
    waits = corral("flows", "delete", "stripe", "--tenant", "acme", check=False)
    assert waits.returncode == 2
    assert "1 jobs of flow 'stripe' have not ended yet" in waits.stderr
    corral("flows", "delete", "stripe", "--tenant", "beta")
    assert "stripe" in corral("flows", "list", "--tenant", "acme").stdout  # a's stays
    gone = corral("flows", "show", "stripe", "--tenant", "beta", check=False)
    assert gone.returncode == 1
    assert "no flow 'stripe'" in gone.stderr


def test_a_hold_that_has_ended_is_not_shown(corral: Run, tmp_path: Path) -> None:
    """A Retry-After's hold is shown by `flows list` and `flows show` until its time only
    (the holds written as a completion would, one ended an hour ago, one ending in an hour)."""
    for name in ("ended", "holding"):
        corral("flows", "add", name, "--tenant", "acme")
    now = datetime.now(UTC)
    engine = create_engine(f"sqlite:///{tmp_path / 'corral.db'}")
    with engine.begin() as conn:
        for name, until in (
            ("ended", now - timedelta(hours=1)),
            ("holding", now + timedelta(hours=1)),
        ):
            conn.execute(
                tables.flows.update()
                .where(tables.flows.c.name == name)
                .values(held_until=until, held_reason=f"a 429 with Retry-After ({name})")
            )
    engine.dispose()
    listed = json.loads(corral("flows", "list", "--tenant", "acme", "--json").stdout)
    held = {f["name"]: (f["held_until"] is not None, f["held_reason"]) for f in listed}
    assert held == {"ended": (False, None), "holding": (True, "a 429 with Retry-After (holding)")}
    shown = corral("flows", "show", "ended", "--tenant", "acme").stdout
    assert "held until" not in shown
    shown = corral("flows", "show", "holding", "--tenant", "acme").stdout
    assert "held until" in shown
    assert "(holding)" in shown
