"""Flows kept as code (client/apply_flows.py) on both databases: made, changed (a rate as
it is written or as it is said again, a limit left out cleared) and pruned; exported; a
schedule naming a flow the same apply makes (and a flow gone before the transaction found
by it); a flow still named by a schedule or an unfinished job never pruned, the whole
apply refused; another tenant's flow document refused, and two tenants' flows of one name
apart. And objects made by hand of every kind, exported and applied again, have nothing to
do: each is taken over (`adopted`), marked managed by the apply, never by a dry run."""

from __future__ import annotations

import pytest

from corral import client, config, documents, errors, store
from tests.support.api import noop_client, serving

PUBLIC = "https://corral.example.com"
HOOK = "https://93.184.216.34/hooks/T000/B000"  # an address the guard allows, never sent to
FLOWS = """
kind: Flow
name: stripe
rate: 10/1s
parallelism: 4
---
kind: Flow
name: partner
parallelism: 2
"""
SYNC = """
kind: Schedule
name: sync
every: 15m
executor: noop
spec: {}
flow: stripe
"""


@pytest.fixture
def c(db: store.Store) -> client.Client:
    return noop_client(db, settings=config.Settings(public_url=PUBLIC))


async def applied(c: client.Client, text: str, tenant: str = "a", **how: bool) -> list[str]:
    return documents.plan_lines(await c.apply(tenant, documents.parse(text, "f.yaml"), **how))


async def limits(c: client.Client, tenant: str = "a") -> dict[str, tuple[str | None, int | None]]:
    return {
        f.name: (None if f.rate is None else str(f.rate), f.parallelism)
        for f in await c.flows(tenant)
    }


async def test_flows_are_made_changed_exported_and_pruned(c: client.Client) -> None:
    await c.flow_add("a", {"name": "by-hand", "rate": "1/1s"})
    assert await applied(c, FLOWS, dry_run=True) == ["+ Flow partner", "+ Flow stripe"]
    assert list(await limits(c)) == ["by-hand"]  # a dry run changes nothing
    assert await applied(c, FLOWS) == ["+ Flow partner", "+ Flow stripe"]
    assert await limits(c) == {
        "by-hand": ("1/1s", None),
        "partner": (None, 2),
        "stripe": ("10/1s", 4),
    }
    assert await applied(c, FLOWS) == ["= Flow partner", "= Flow stripe"]

    # 600/60s is 600/1m as stored; parallelism left out is none.
    changed = FLOWS.replace("rate: 10/1s\nparallelism: 4", "rate: 600/60s")
    assert await applied(c, changed) == ["= Flow partner", "~ Flow stripe: parallelism, rate"]
    assert (await limits(c))["stripe"] == ("600/1m", None)
    assert await applied(c, changed.replace("600/60s", "600/1m")) == [
        "= Flow partner",
        "= Flow stripe",
    ]
    assert await c.export("a", ["Flow"]) == [
        {"kind": "Flow", "name": "by-hand", "rate": "1/1s"},
        {"kind": "Flow", "name": "partner", "parallelism": 2},
        {"kind": "Flow", "name": "stripe", "rate": "600/1m"},
    ]

    stripe_only = changed.split("---")[0]
    assert await applied(c, stripe_only, prune=True) == ["- Flow partner", "= Flow stripe"]
    assert list(await limits(c)) == ["by-hand", "stripe"]  # made by hand: never pruned


async def test_a_bad_flow_document_is_refused_naming_the_field(c: client.Client) -> None:
    bad = FLOWS.replace("10/1s", "10 per second").replace("parallelism: 2", "burst: 2")
    with pytest.raises(errors.InvalidInput) as refused:
        await applied(c, bad)
    first, second = str(refused.value).splitlines()
    assert first.startswith("f.yaml: document 1 (Flow 'stripe'): rate: '10 per second' is not")
    assert second == (
        "f.yaml: document 2 (Flow 'partner'): burst: unknown field (a Flow has rate and"
        " parallelism)"
    )
    with pytest.raises(errors.InvalidInput, match=r"\(Flow 'no way'\): name: required"):
        await applied(c, "kind: Flow\nname: no way\n")
    assert await c.flows("a") == []


async def test_a_schedule_names_a_flow_the_same_apply_makes(c: client.Client) -> None:
    text = SYNC + "---\n" + FLOWS
    for dry_run in (True, False):
        assert await applied(c, text, dry_run=dry_run) == [
            "+ Flow partner",
            "+ Flow stripe",
            "+ Schedule sync",
        ]
    assert (await c.schedule("sync", tenant="a")).template["flow"] == "stripe"
    exported = await c.export("a")
    [sync] = [d for d in exported if d["kind"] == "Schedule"]
    assert (sync["flow"], sync["spec"]) == ("stripe", {})  # an empty spec too: it is required
    again = await c.apply("a", documents.parse(documents.dumped(exported), "-"), dry_run=True)
    assert {(s.action, s.adopted) for s in again} == {(documents.Action.UNCHANGED, False)}

    # The schedule moves to partner while stripe is pruned: one apply.
    moved = SYNC.replace("flow: stripe", "flow: partner") + "---\n" + FLOWS.split("---")[1]
    assert await applied(c, moved, prune=True) == [
        "= Flow partner",
        "- Flow stripe",
        "~ Schedule sync: flow",
    ]
    with pytest.raises(errors.InvalidInput) as refused:
        await applied(c, SYNC.replace("flow: stripe", "flow: nowhere"))
    assert str(refused.value).startswith(
        "f.yaml: document 1 (Schedule 'sync'): flow: tenant 'a' has no flow named 'nowhere'"
    )


async def test_a_flow_gone_between_the_plan_and_its_transaction_is_found_there(
    c: client.Client,
) -> None:
    new, anchor = c.new_schedule(
        "sync", every="1h", executor="noop", spec={}, flow="gone", tenant="a"
    )
    where = ("f.yaml: document 1 (Schedule 'sync')", "schedule", "a", "sync")
    write = store.manifests.ScheduleMade(*where, new, anchor, None, None)
    with pytest.raises(errors.InvalidInput) as refused:
        await c.store.manifests.apply(tenant="a", writes=[write], now=c.clock.now(), dry_run=False)
    assert str(refused.value).startswith(
        "f.yaml: document 1 (Schedule 'sync'): flow: tenant 'a' has no flow named 'gone'"
    )
    assert await c.schedules(tenant="a") == []


async def test_a_flow_still_named_is_never_pruned_and_the_apply_is_refused_whole(
    c: client.Client,
) -> None:
    assert len(await applied(c, SYNC + "---\n" + FLOWS)) == 3
    partner = FLOWS.split("---")[1]
    for dry_run in (True, False):
        with pytest.raises(errors.Conflict) as refused:
            await applied(c, SYNC + "---\n" + partner, prune=True, dry_run=dry_run)
        assert str(refused.value) == (
            "--prune: Flow 'stripe': name: schedule 'sync' names flow 'stripe'; change or"
            " delete the schedule first"
        )
    assert list(await limits(c)) == ["partner", "stripe"]

    job_id, _ = await c.submit(executor="noop", spec={}, flow="stripe", tenant="a")
    with pytest.raises(errors.Conflict) as refused:
        await applied(c, partner, prune=True)
    assert str(refused.value) == (
        "--prune: Flow 'stripe': name: 1 jobs of flow 'stripe' have not ended yet (queued,"
        " scheduled, running, quarantined or parked); wait for them, or cancel them, then"
        " delete the flow"
    )
    assert [s.name for s in await c.schedules(tenant="a")] == ["sync"]  # nothing was deleted
    await c.cancel(job_id)
    assert await applied(c, partner, prune=True) == [
        "= Flow partner",
        "- Flow stripe",
        "- Schedule sync",
    ]
    assert await c.schedules(tenant="a") == []


async def test_flows_are_their_tenant_s_own(c: client.Client, db: store.Store) -> None:
    theirs = FLOWS.replace("name: partner", "name: partner\ntenant: b")
    with pytest.raises(errors.InvalidInput) as refused:
        await applied(c, theirs)
    assert str(refused.value) == (
        "f.yaml: document 2 (Flow 'partner'): tenant: 'b' is not the tenant applied to ('a'):"
        " apply it to its own tenant, or leave tenant out"
    )
    assert await applied(c, FLOWS, tenant="b") == ["+ Flow partner", "+ Flow stripe"]
    assert await applied(c, FLOWS.replace("10/1s", "5/1s")) == ["+ Flow partner", "+ Flow stripe"]
    assert (await limits(c, "b"))["stripe"] == ("10/1s", 4)
    assert await applied(c, "", prune=True) == ["- Flow partner", "- Flow stripe"]
    assert list(await limits(c, "b")) == ["partner", "stripe"]  # b's, untouched by a's prune
    with pytest.raises(errors.InvalidInput, match="flow: tenant 'a' has no flow named 'stripe'"):
        await applied(c, SYNC)  # b's flow of that name is not a's

    async with serving(db, [("a-op", "a", "operator")]) as api:
        body = {"documents": [{"kind": "Flow", "name": "x", "parallelism": 1, "tenant": "b"}]}
        r = await api.http.post("/api/v1/apply", json=body, headers=api.as_("a-op"))
        assert r.status_code == 422
        assert "tenant: 'b' is not the tenant applied to ('a')" in r.json()["error"]
        r = await api.http.post(
            "/api/v1/apply", json={"documents": body["documents"][:0]}, headers=api.as_("a-op")
        )
        assert r.json()["steps"] == []
    assert "x" not in await limits(c, "b")


async def made_by_hand(c: client.Client, tenant: str) -> None:
    """One object of every kind, each made as the CLI and the API make them."""
    await c.flow_add(tenant, {"name": "stripe", "rate": "10/1s", "parallelism": 2})
    await c.tenant_channel_add(tenant, {"name": "oncall", "kind": "webhook", "url": HOOK})
    rule = {"name": "broken", "on": ["failed"], "channels": ["oncall"]}
    await c.tenant_rule_add(tenant, rule)
    monitor = {"name": "backup", "period": "1h", "grace": "5m", "channels": ["oncall"]}
    await c.monitor_add(tenant, monitor)
    await c.schedule_create(
        "sync", every="1h", executor="noop", spec={}, flow="stripe", tenant=tenant
    )


async def test_an_export_of_objects_made_by_hand_is_nothing_to_do_and_takes_them_over(
    c: client.Client,
) -> None:
    await made_by_hand(c, "a")
    text = documents.dumped(await c.export("a"))
    every = [
        "= Flow stripe (taken over)",
        "= AlertChannel oncall (taken over)",
        "= AlertRule broken (taken over)",
        "= Monitor backup (taken over)",
        "= Schedule sync (taken over)",
    ]
    plan = await c.apply("a", documents.parse(text, "-"), dry_run=True)
    assert documents.plan_lines(plan) == every
    assert documents.plan_dict("a", plan, dry_run=True)["counts"] == {
        "create": 0, "change": 0, "delete": 0, "unchanged": 5,
    }  # fmt: skip
    assert documents.summary(plan).endswith("5 unchanged; 5 made by hand taken over")
    assert await c.store.manifests.managed(tenant="a") == {
        "schedule": set(), "monitor": set(), "channel": set(), "rule": set(), "flow": set(),
    }  # fmt: skip
    assert await applied(c, "", prune=True) == []  # made by hand: nothing to prune

    assert documents.plan_lines(await c.apply("a", documents.parse(text, "-"))) == every
    managed = await c.store.manifests.managed(tenant="a")
    assert all(len(names) == 1 for names in managed.values()), managed
    assert await applied(c, text) == [line.removesuffix(" (taken over)") for line in every]
    assert await applied(c, "", prune=True) == [
        "- Flow stripe",
        "- AlertChannel oncall",
        "- AlertRule broken",
        "- Monitor backup",
        "- Schedule sync",
    ]  # taken over, so pruned: the schedule before its flow, the rule before its channel
    assert await c.export("a") == []


async def test_one_made_by_hand_and_changed_is_taken_over_with_its_change(
    c: client.Client,
) -> None:
    await c.flow_add("a", {"name": "stripe", "rate": "10/1s"})
    plan = await c.apply("a", documents.parse(FLOWS.split("---")[0], "f.yaml"))
    assert documents.plan_lines(plan) == ["~ Flow stripe: parallelism (taken over)"]
    assert documents.plan_dict("a", plan, dry_run=False)["steps"] == [
        {
            "action": "change",
            "kind": "Flow",
            "name": "stripe",
            "fields": ["parallelism"],
            "adopted": True,
        }
    ]
    assert (await c.store.manifests.managed(tenant="a"))["flow"] == {"stripe"}
