"""Objects kept as code (corral.client.apply) on both databases: a folder applied twice (the
second time, nothing to do), then with one schedule changed (the diff names its fields),
then with --prune once a file is gone (only what apply made is deleted), each plan exact;
an export applied again is nothing to do, its secrets `kept`; a document of another tenant,
and a bad document, are refused whole, naming the file, the document and the field; and
POST /api/v1/apply acts on its token's tenant only."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral import client, config, documents, errors, store
from corral.executors import registry
from corral.testing import FrozenClock
from tests.support.api import serving

PUBLIC = "https://corral.example.com"
HOOK = "https://93.184.216.34/hooks/T000/B000"  # an address the guard allows, never sent to
FILES = {
    "alerts.yaml": f"""
kind: AlertChannel
name: oncall
type: webhook
url: {HOOK}
secret: whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw
---
kind: AlertRule
name: broken
on: [failed, quarantined]
channels: [oncall]
match: {{schedule: nightly}}
""",
    "monitors.yaml": """
kind: Monitor
name: backup
period: 1h
grace: 5m
channels: [oncall]
""",
    "nightly.yaml": """
kind: Schedule
name: nightly
cron: "0 2 * * *"
tz: Europe/Paris
spec: {command: [sh, -c, "echo export"]}
""",
    "hourly.toml": """
kind = "Schedule"
name = "hourly"
every = "1h"
start = 2026-01-01T00:00:00Z
executor = "http"
spec = { url = "https://93.184.216.34/sync?token=s3cr3t", headers = { Authorization = "Bearer s3cr3t" } }
""",
    "weekly.toml": """
[[document]]
kind = "Schedule"
name = "weekly"
cron = "0 6 * * 1"
spec = { command = ["true"] }

[[document]]
kind = "Monitor"
name = "weekly-backup"
cron = "0 7 * * 1"
tz = "Europe/Berlin"
grace = "1h"
""",
}
CREATED = [
    "+ AlertChannel oncall",
    "+ AlertRule broken",
    "+ Monitor backup",
    "+ Monitor weekly-backup",
    "+ Schedule hourly",
    "+ Schedule nightly",
    "+ Schedule weekly",
]


def unchanged(lines: list[str]) -> list[str]:
    return [line.replace("+", "=", 1) for line in lines]


@pytest.fixture
async def c(db: store.Store) -> client.Client:
    """A client that checks process and HTTP jobs as `corral apply` does (and runs none)."""
    settings = config.Settings(public_url=PUBLIC, executors={"enabled": ["process", "http"]})
    clock = FrozenClock()
    checkers = {kind: registry.checker(kind, settings, clock) for kind in ("process", "http")}
    return client.Client(store=db, executors={}, checkers=checkers, settings=settings, clock=clock)


def folder(path: Path, files: dict[str, str]) -> Path:
    path.mkdir(exist_ok=True)
    for name, text in files.items():
        (path / name).write_text(text)
    return path


def read(path: Path) -> list[documents.Document]:
    """The documents of a folder, as `corral apply -f` reads them (by file name)."""
    return [doc for f in sorted(path.iterdir()) for doc in documents.parse(f.read_text(), f.name)]


async def applied(c: client.Client, path: Path, tenant: str = "a", **how: bool) -> list[str]:
    return documents.plan_lines(await c.apply(tenant, read(path), **how))


async def test_a_folder_applied_twice_then_changed_then_pruned(
    c: client.Client, tmp_path: Path
) -> None:
    conf = folder(tmp_path / "conf", FILES)
    by_hand = await c.schedule_create("by-hand", every="1d", tenant="a", spec={"command": ["true"]})
    assert await applied(c, conf, dry_run=True) == CREATED
    assert await c.schedules(tenant="a") == [by_hand]  # a dry run changes nothing
    assert await applied(c, conf) == CREATED
    assert await applied(c, conf) == unchanged(CREATED)

    changed = FILES["nightly.yaml"].replace("0 2 * * *", "30 2 * * *").replace("export", "dump")
    folder(conf, {"nightly.yaml": changed})
    nightly = await c.schedule("nightly", tenant="a")
    lines = unchanged(CREATED)
    lines[5] = "~ Schedule nightly: cron, spec.command"
    assert await applied(c, conf) == lines
    after = await c.schedule("nightly", tenant="a")
    assert (after.id, after.cron, after.template["spec"]["command"][-1]) == (
        nightly.id,
        "30 2 * * *",
        "echo dump",
    )

    (conf / "weekly.toml").unlink()
    assert await applied(c, conf, prune=True) == [
        "= AlertChannel oncall",
        "= AlertRule broken",
        "= Monitor backup",
        "- Monitor weekly-backup",
        "= Schedule hourly",
        "= Schedule nightly",
        "- Schedule weekly",
    ]
    assert [s.name for s in await c.schedules(tenant="a")] == ["by-hand", "hourly", "nightly"]
    assert [m.name for m in await c.monitors("a")] == ["backup"]
    assert await applied(c, conf, prune=True) == unchanged(CREATED[:3] + CREATED[4:6])


async def test_an_export_applied_again_is_nothing_to_do_and_keeps_its_secrets(
    c: client.Client, tmp_path: Path
) -> None:
    await applied(c, folder(tmp_path / "conf", FILES))
    exported = await c.export("a")
    for as_json in (False, True):
        text = documents.dumped(exported, as_json=as_json)
        assert "s3cr3t" not in text
        assert "whsec_" not in text
        assert "T000" not in text
        assert text.count(documents.KEPT) == 4  # the channel's url and secret, the token
        again = await c.apply("a", documents.parse(text, "-"), dry_run=True)
        assert {s.action for s in again} == {documents.Action.UNCHANGED}
        assert len(again) == len(CREATED)
    [hourly] = [d for d in await c.export("a", ["Schedule"]) if d["name"] == "hourly"]
    assert hourly["spec"]["headers"] == {"Authorization": documents.KEPT}
    assert hourly["start"] == "2026-01-01T00:00:00Z"
    [channel] = await c.export("a", ["AlertChannel"])
    assert channel == {"kind": "AlertChannel", "name": "oncall", "type": "webhook",
                       "url": "kept", "secret": "kept"}  # fmt: skip
    stored = (await c.tenant_channels("a"))[0].config
    assert stored["url"] == HOOK
    assert stored["secret"].startswith("whsec_")


async def test_a_document_of_another_tenant_is_refused_and_nothing_is_applied(
    c: client.Client, tmp_path: Path
) -> None:
    theirs = FILES["monitors.yaml"].replace("kind: Monitor", "kind: Monitor\ntenant: b")
    conf = folder(tmp_path / "conf", {"nightly.yaml": FILES["nightly.yaml"], "x.yaml": theirs})
    with pytest.raises(errors.InvalidInput) as refused:
        await c.apply("a", read(conf))
    assert str(refused.value) == (
        "x.yaml: document 1 (Monitor 'backup'): tenant: 'b' is not the tenant applied to"
        " ('a'): apply it to its own tenant, or leave tenant out"
    )
    assert await c.schedules(tenant="a") == []


async def test_a_bad_document_is_refused_whole_naming_its_file_document_and_field(
    c: client.Client, tmp_path: Path
) -> None:
    bad = """
kind: Schedule
name: fine
every: 1h
spec: {command: ["true"]}
---
kind: Schedule
name: broken
cron: "61 * * * *"
spec: {command: ["true"]}
---
kind: Monitor
name: backup
period: 1h
graceful: 5m
"""
    conf = folder(tmp_path / "conf", {"bad.yaml": bad})
    with pytest.raises(errors.InvalidInput) as refused:
        await c.apply("a", read(conf))
    first, second = str(refused.value).splitlines()
    assert first.startswith("bad.yaml: document 2 (Schedule 'broken'): cron: ")
    assert second.startswith("bad.yaml: document 3 (Monitor 'backup'): graceful: unknown field")
    assert await c.schedules(tenant="a") == []
    assert await c.monitors("a") == []

    # What only the transaction tells (a rule's channel missing) undoes the documents before.
    missing = FILES["alerts.yaml"].split("---")[1]
    folder(conf, {"bad.yaml": FILES["nightly.yaml"], "rule.yaml": missing})
    for dry_run in (True, False):
        with pytest.raises(errors.InvalidInput) as refused:
            await c.apply("a", read(conf), dry_run=dry_run)
        assert str(refused.value) == (
            "rule.yaml: document 1 (AlertRule 'broken'): channels: tenant 'a' has no alert"
            " channel named 'oncall'"
        )
    assert await c.schedules(tenant="a") == []


async def test_kept_with_nothing_stored_behind_it_is_refused(c: client.Client) -> None:
    text = (
        FILES["alerts.yaml"]
        .split("---")[0]
        .replace("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "kept")
    )
    with pytest.raises(
        errors.InvalidInput, match=r"document 1 \(AlertChannel 'oncall'\): secret: 'kept' keeps"
    ):
        await c.apply("a", documents.parse(text, "c.yaml"))
    header = FILES["hourly.toml"].replace("Bearer s3cr3t", "kept")
    with pytest.raises(errors.InvalidInput, match=r"spec\.headers\.Authorization: 'kept' keeps"):
        await c.apply("a", documents.parse(header, "h.toml"))


async def test_a_monitor_changed_keeps_its_ping_url_and_one_made_by_hand_is_taken_over(
    c: client.Client, tmp_path: Path
) -> None:
    await c.tenant_channel_add("a", {"name": "oncall", "kind": "webhook", "url": HOOK})
    conf = folder(
        tmp_path / "conf", {"m.yaml": FILES["monitors.yaml"].replace("channels: [oncall]\n", "")}
    )
    doc = "kind: AlertChannel\nname: oncall\ntype: webhook\nurl: " + HOOK
    folder(conf, {"c.yaml": doc})
    assert await applied(c, conf) == ["= AlertChannel oncall (taken over)", "+ Monitor backup"]
    key = (await c.monitor("a", "backup")).ping_key
    folder(conf, {"m.yaml": FILES["monitors.yaml"].replace("5m", "10m")})
    assert await applied(c, conf) == [
        "= AlertChannel oncall",
        "~ Monitor backup: channels, grace",
    ]
    monitor = await c.monitor("a", "backup")
    assert (monitor.ping_key, monitor.grace.total_seconds(), monitor.rule) == (
        key,
        600,
        "monitor-backup",
    )
    assert await c.export("a", ["AlertRule"]) == []  # the monitor's rule is the monitor's
    (conf / "m.yaml").unlink()
    (conf / "c.yaml").unlink()
    assert await c.apply("a", [], prune=True) != []
    assert await c.monitors("a") == []
    assert await c.tenant_rules("a") == []
    assert await c.tenant_channels("a") == []  # taken over, so managed, so pruned


async def test_the_api_applies_to_its_token_s_tenant_only(db: store.Store) -> None:
    tokens = [("a-op", "a", "operator"), ("b-op", "b", "operator"), ("a-view", "a", "viewer")]
    schedule = {"kind": "Schedule", "name": "n", "every": "1h", "executor": "noop", "spec": {}}
    async with serving(db, tokens) as api:
        body = {"documents": [schedule], "dry_run": True}
        r = await api.http.post("/api/v1/apply", json=body, headers=api.as_("a-view"))
        assert r.status_code == 403
        r = await api.http.post("/api/v1/apply", json=body, headers=api.as_("a-op"))
        assert r.status_code == 200, r.text
        assert r.json()["steps"] == [
            {"action": "create", "kind": "Schedule", "name": "n", "fields": [], "adopted": False}
        ]
        assert await api.c.schedules(tenant="a") == []
        text = "kind: Schedule\nname: n\nevery: 1h\nexecutor: noop\nspec: {}\n"
        files = {"files": [{"name": "n.yaml", "text": text}]}
        r = await api.http.post("/api/v1/apply", json=files, headers=api.as_("a-op"))
        assert (r.status_code, r.json()["counts"]["create"]) == (200, 1)
        made = await api.c.schedule("n", tenant="a")
        assert (made.tenant_made, made.managed) == (True, True)

        theirs = {"documents": [{**schedule, "tenant": "a"}]}
        r = await api.http.post("/api/v1/apply", json=theirs, headers=api.as_("b-op"))
        assert r.status_code == 422
        assert r.json()["error"].startswith(
            "documents: document 1 (Schedule 'n'): tenant: 'a' is not the tenant applied to ('b')"
        )
        r = await api.http.post(
            "/api/v1/apply", json={"documents": [], "tenant": "a", "prune": True},
            headers=api.as_("b-op"),
        )  # fmt: skip
        assert r.status_code == 422
        assert r.json()["field"] == "tenant"
        r = await api.http.post(
            "/api/v1/apply", json={"documents": [], "prune": True}, headers=api.as_("b-op")
        )
        assert (r.status_code, r.json()["steps"]) == (200, [])
        assert (await api.c.schedule("n", tenant="a")).id == made.id  # untouched by b
