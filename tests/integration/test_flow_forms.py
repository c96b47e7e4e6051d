"""The flows page of the dashboard (/ui/flows) and its forms, over HTTP on both databases:
an operator adds a flow, changes its limits on its page and deletes it, each audited; a
refused rate or a name taken is shown beside its field; a deletion while a schedule names
the flow is refused above the list; a viewer sees the list without a form and is refused
every POST; another tenant's flow is not found by its page and forms, and stays as it was;
an admin picks the tenant with ?tenant=; the job and schedule forms name a flow (refused
beside the field when the tenant has none so named), and a schedule's edit form keeps it."""

from __future__ import annotations

import html
from collections.abc import AsyncIterator

import httpx
import pytest

from corral import client, store
from tests.support.api import over_http
from tests.support.forms import error_of, forms_client, post, signed, values


@pytest.fixture
async def c(db: store.Store) -> client.Client:
    return await forms_client(db)


@pytest.fixture
async def http(c: client.Client) -> AsyncIterator[httpx.AsyncClient]:
    async with over_http(c) as made:
        yield made


async def test_an_operator_adds_changes_and_deletes_a_flow(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    token = await signed(http, c, "ada")
    empty = await http.get("/ui/flows")
    assert 'id="flow-form"' in empty.text
    made = await post(http, "/ui/flows", token, flow="stripe", rate="10/1s", parallelism="4")
    assert made.status_code == 303, made.text
    assert made.headers["location"] == "/ui/flows?note=flow-made&name=stripe"
    listed = await http.get(made.headers["location"])
    assert "flow stripe made" in listed.text
    assert 'id="flow-stripe"' in listed.text
    assert 'href="/ui/flows/a/stripe"' in listed.text
    shown = await http.get("/ui/flows/a/stripe")
    assert values(shown, "flow-change-form") == {"csrf": token, "rate": "10/1s",
                                                 "parallelism": "4"}  # fmt: skip
    changed = await post(http, "/ui/flows/a/stripe/edit", token, rate="600/1m", parallelism="")
    assert changed.status_code == 303, changed.text
    assert changed.headers["location"] == "/ui/flows/a/stripe?note=flow-changed&name=stripe"
    [flow] = await c.flows("a")
    assert (str(flow.rate), flow.parallelism) == ("600/1m", None)
    went = await post(http, "/ui/flows/a/stripe/delete", token)
    assert went.status_code == 303, went.text
    assert went.headers["location"] == "/ui/flows?note=flow-deleted&name=stripe"
    assert await c.flows("a") == []
    actions = [a.action for a in await c.audit_list(limit=20)]
    assert {"flows.create", "flows.update", "flows.delete"} <= set(actions)


async def test_a_refused_form_is_drawn_again_with_the_error_beside_its_field(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    token = await signed(http, c, "ada")
    bad_rate = await post(http, "/ui/flows", token, flow="stripe", rate="fast")
    assert bad_rate.status_code == 422
    assert error_of(bad_rate, "rate").startswith("rate: 'fast' is not N/PERIOD")
    assert 'value="stripe"' in bad_rate.text  # what was typed stays
    bad_name = await post(http, "/ui/flows", token, flow="-no", rate="1/1s")
    assert bad_name.status_code == 422
    assert error_of(bad_name, "flow").startswith("name: required")
    assert await c.flows("a") == []
    assert (await post(http, "/ui/flows", token, flow="stripe")).status_code == 303
    taken = await post(http, "/ui/flows", token, flow="stripe", parallelism="2")
    assert taken.status_code == 409
    assert "has a flow named 'stripe' already" in error_of(taken, "flow")
    bad_change = await post(http, "/ui/flows/a/stripe/edit", token, rate="", parallelism="0")
    assert bad_change.status_code == 422
    assert error_of(bad_change, "parallelism").startswith("parallelism: a whole number")
    [flow] = await c.flows("a")
    assert (flow.rate, flow.parallelism) == (None, None)


async def test_a_flow_a_schedule_names_is_not_deleted(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    token = await signed(http, c, "ada")
    await c.flow_add("a", {"name": "stripe", "rate": "10/1s"})
    made = await post(http, "/ui/schedules", token, **SCHEDULE, flow="stripe")
    assert made.status_code == 303, made.text
    refused = await post(http, "/ui/flows/a/stripe/delete", token)
    assert refused.status_code == 409
    assert "schedule 'hourly' names flow 'stripe'" in html.unescape(refused.text)
    assert 'id="error-form"' in refused.text
    assert len(await c.flows("a")) == 1


async def test_a_viewer_sees_the_flows_but_may_not_act(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    await c.flow_add("a", {"name": "stripe", "rate": "10/1s"})
    token = await signed(http, c, "vic")
    for path in ("/ui/flows", "/ui/flows/a/stripe"):
        shown = await http.get(path)
        assert shown.status_code == 200
        assert "stripe" in shown.text
        assert "<form" not in shown.text.replace('action="/ui/sign-out"', "").split("<main>")[1]
    for path, fields in (("/ui/flows", {"flow": "x"}), ("/ui/flows/a/stripe/edit", {"rate": ""}),
                         ("/ui/flows/a/stripe/delete", {})):  # fmt: skip
        assert (await post(http, path, token, **fields)).status_code == 403
    [flow] = await c.flows("a")
    assert str(flow.rate) == "10/1s"


async def test_another_tenant_s_flow_is_not_found_nor_changed(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    await c.flow_add("a", {"name": "stripe", "rate": "10/1s"})
    token = await signed(http, c, "bea")
    assert "stripe" not in (await http.get("/ui/flows")).text
    assert (await http.get("/ui/flows?tenant=a")).status_code == 404
    assert (await http.get("/ui/flows/a/stripe")).status_code == 404
    assert (await http.get("/ui/flows/b/stripe")).status_code == 404
    for path in ("/ui/flows/a/stripe/edit", "/ui/flows/a/stripe/delete",
                 "/ui/flows/b/stripe/edit", "/ui/flows/b/stripe/delete"):  # fmt: skip
        assert (await post(http, path, token, rate="1/1d")).status_code == 404
    made = await post(http, "/ui/flows", token, flow="stripe", tenant="a", rate="1/1d")
    assert made.status_code == 404  # a session of one tenant names no other
    [flow] = await c.flows("a")
    assert str(flow.rate) == "10/1s"
    assert await c.flows("b") == []
    root = await signed(http, c, "root")  # a session of every tenant picks the tenant
    assert 'id="flow-stripe"' in (await http.get("/ui/flows?tenant=a")).text
    assert 'id="flow-stripe"' not in (await http.get("/ui/flows?tenant=b")).text
    made = await post(http, "/ui/flows", root, flow="stripe", tenant="b", rate="1/1d")
    assert made.headers["location"] == "/ui/flows?tenant=b&note=flow-made&name=stripe"
    assert [str(f.rate) for f in await c.flows("b")] == ["1/1d"]
    assert [str(f.rate) for f in await c.flows("a")] == ["10/1s"]


SCHEDULE = {"name": "hourly", "when": "every", "every": "1h", "tz": "UTC", "method": "GET",
            "url": "https://hooks.example.com/tick", "expect": "2xx"}  # fmt: skip
JOB = {"when": "now", "tz": "UTC", "method": "POST", "url": "https://hooks.example.com/x",
       "expect": "2xx"}  # fmt: skip


async def test_a_job_and_a_schedule_made_with_a_flow_from_the_forms(
    http: httpx.AsyncClient, c: client.Client
) -> None:
    await c.flow_add("a", {"name": "stripe", "rate": "10/1s"})
    await c.flow_add("b", {"name": "theirs", "rate": "10/1s"})
    token = await signed(http, c, "ada")
    for path, form in (("/ui/jobs/http", JOB), ("/ui/schedules", SCHEDULE)):
        missing = await post(http, path, token, **form, flow="theirs")  # b's: not a's
        assert missing.status_code == 422, missing.text
        assert error_of(missing, "flow").startswith("flow: tenant 'a' has no flow named 'theirs'")
        assert "<details open>" in missing.text  # the field is under More
    job = await post(http, "/ui/jobs/http", token, **JOB, flow="stripe")
    assert job.status_code == 303, job.text
    job_id = int(job.headers["location"].rsplit("/", 1)[1])
    assert (await c.job(job_id)).job.flow == "stripe"
    copy = await http.get(f"/ui/jobs/new?copy={job_id}")
    assert values(copy, "job-form")["flow"] == "stripe"
    made = await post(http, "/ui/schedules", token, **SCHEDULE, flow="stripe")
    assert made.status_code == 303, made.text
    assert (await c.schedule("hourly", tenant="a")).template["flow"] == "stripe"
    edit = await http.get("/ui/schedules/a/hourly/edit")
    kept = values(edit, "schedule-form")
    assert kept["flow"] == "stripe"
    saved = await post(http, "/ui/schedules/a/hourly/edit", token, **kept)
    assert saved.status_code == 303, saved.text
    assert (await c.schedule("hourly", tenant="a")).template["flow"] == "stripe"
    cleared = await post(http, "/ui/schedules/a/hourly/edit", token, **{**kept, "flow": ""})
    assert cleared.status_code == 303, cleared.text
    assert (await c.schedule("hourly", tenant="a")).template.get("flow") is None
