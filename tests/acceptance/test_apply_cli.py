"""`corral apply` and `corral export` as the operator runs them, in a subprocess on a real
SQLite file: a folder of YAML and TOML files applied (`--json`: the plan), again (nothing
to do), `export` piped into `apply -f - --dry-run` (nothing to do), pruned once a file is
gone, and refusals that exit 2 naming the file, the document and the field; a flow made
by hand and a schedule naming it, exported and applied again: taken over, nothing to do."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.cli import Run, corral_env, run_corral

SCHEDULES = """
kind: Schedule
name: nightly
cron: "0 2 * * *"
spec: {command: ["true"]}
---
kind: Schedule
name: hourly
every: 1h
spec: {command: [sh, -c, "echo hourly"]}
"""
RULES = """
[[document]]
kind = "AlertChannel"
name = "oncall"
type = "webhook"
url = "https://93.184.216.34/hooks/T000"  # the guard allows it; nothing is sent

[[document]]
kind = "AlertRule"
name = "broken"
on = ["failed"]
channels = ["oncall"]
match = { schedule = "nightly" }
"""


def test_the_operator_applies_exports_and_prunes_a_folder(corral: Run, tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "schedules.yaml").write_text(SCHEDULES)
    (conf / "rules.toml").write_text(RULES)
    plan = json.loads(corral("apply", "-f", "conf", "--tenant", "acme", "--json").stdout)
    assert [(s["action"], s["kind"], s["name"]) for s in plan["steps"]] == [
        ("create", "AlertChannel", "oncall"),
        ("create", "AlertRule", "broken"),
        ("create", "Schedule", "hourly"),
        ("create", "Schedule", "nightly"),
    ]
    again = corral("apply", "-f", "conf", "--tenant", "acme")
    assert again.stdout.splitlines() == [
        "= AlertChannel oncall", "= AlertRule broken", "= Schedule hourly", "= Schedule nightly",
    ]  # fmt: skip
    assert "0 to create, 0 to change, 0 to delete, 4 unchanged; applied" in again.stderr

    exported = corral("export", "--tenant", "acme").stdout
    assert exported.startswith("---\nkind: AlertChannel\nname: oncall\ntype: webhook\nurl: kept\n")
    assert "T000" not in exported
    piped = run_corral(
        tmp_path, "apply", "-f", "-", "--tenant", "acme", "--dry-run", "--json",
        env=corral_env(), stdin=exported, check=True,
    )  # fmt: skip
    assert json.loads(piped.stdout)["counts"] == {
        "create": 0, "change": 0, "delete": 0, "unchanged": 4,
    }  # fmt: skip

    (conf / "rules.toml").unlink()
    pruned = corral("apply", "-f", "conf", "--tenant", "acme", "--prune").stdout.splitlines()
    assert pruned == [
        "- AlertChannel oncall", "- AlertRule broken", "= Schedule hourly", "= Schedule nightly",
    ]  # fmt: skip
    assert (
        json.loads(corral("export", "--tenant", "acme", "--kind", "AlertRule", "--json").stdout)
        == []
    )


def test_refusals_exit_2_naming_the_file_the_document_and_the_field(
    corral: Run, tmp_path: Path
) -> None:
    conf = tmp_path / "conf"
    conf.mkdir()
    bad = SCHEDULES.replace("every: 1h", "every: soon")
    (conf / "schedules.yaml").write_text(bad)
    refused = corral("apply", "-f", "conf", check=False)
    assert refused.returncode == 2
    assert "conf/schedules.yaml: document 2 (Schedule 'hourly'): every: " in refused.stderr
    theirs = SCHEDULES.replace("name: nightly", "name: nightly\ntenant: other")
    (conf / "schedules.yaml").write_text(theirs)
    refused = corral("apply", "-f", "conf", "--tenant", "acme", check=False)
    assert refused.returncode == 2
    assert "document 1 (Schedule 'nightly'): tenant: 'other' is not the tenant" in refused.stderr
    (conf / "schedules.yaml").unlink()
    (conf / "rules.toml").write_text(RULES.replace('type = "webhook"', 'type = ["webhook"]'))
    refused = corral("apply", "-f", "conf", check=False)
    assert refused.returncode == 2
    said = "conf/rules.toml: document 1 (AlertChannel 'oncall'): type: required, one of email,"
    assert said in refused.stderr
    assert json.loads(corral("schedules", "list", "--json").stdout) == []
    missing = corral("apply", "-f", "nowhere", check=False)
    assert (missing.returncode, "-f: nowhere: no such file or folder" in missing.stderr) == (
        2,
        True,
    )


def test_a_flow_and_its_schedule_made_by_hand_are_taken_over_as_they_are(
    corral: Run, tmp_path: Path
) -> None:
    corral("flows", "add", "stripe", "--rate", "10/1s", "--tenant", "acme")
    corral("schedules", "add", "sync", "--every", "1h", "--flow", "stripe", "--tenant", "acme",
           "--", "true")  # fmt: skip
    exported = corral("export", "--tenant", "acme").stdout
    assert exported.startswith("---\nkind: Flow\nname: stripe\nrate: 10/1s\n---\nkind: Schedule")
    assert "flow: stripe\n" in exported
    args = ("apply", "-f", "-", "--tenant", "acme")
    dry = run_corral(tmp_path, *args, "--dry-run", env=corral_env(), stdin=exported, check=True)
    taken = ["= Flow stripe (taken over)", "= Schedule sync (taken over)"]
    assert dry.stdout.splitlines() == taken
    assert "2 unchanged; 2 made by hand taken over; dry run: nothing changed" in dry.stderr
    plan = run_corral(tmp_path, *args, "--json", env=corral_env(), stdin=exported, check=True)
    assert [(s["action"], s["adopted"]) for s in json.loads(plan.stdout)["steps"]] == [
        ("unchanged", True),
        ("unchanged", True),
    ]
    again = run_corral(tmp_path, *args, env=corral_env(), stdin=exported, check=True)
    assert again.stdout.splitlines() == [line.split(" (")[0] for line in taken]
    pruned = run_corral(tmp_path, *args, "--prune", env=corral_env(), stdin="", check=True)
    assert pruned.stdout.splitlines() == ["- Flow stripe", "- Schedule sync"]
