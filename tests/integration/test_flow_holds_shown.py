"""A flow's hold shown while it lasts, on both databases: a Retry-After's hold is shown by
the client, the API (list, show, update) and the dashboard's /ui/flows until its time, and
not after it (the time stays stored, as nothing clears it), on the client's clock."""

from __future__ import annotations

from corral import model, store
from corral.store import Finish
from tests.support.api import serving
from tests.support.forms import signed

A = model.AttemptState


async def test_a_hold_is_shown_until_its_time_and_not_after(db: store.Store) -> None:
    async with serving(db, [("a-op", "a", "operator")]) as api:
        c, http, op = api.c, api.http, api.as_("a-op")
        await c.flow_add("a", {"name": "stripe"})
        await c.submit(executor="noop", spec={}, flow="stripe", tenant="a")
        [got] = await c.store.flows.claim(now=c.clock.now(), limit=1, executors=["noop"])
        ended = Finish(got.attempt.id, A.FAILED, 1, None, http_status=429, retry_after=30.0)
        await c.store.attempts.finish(finishes=[ended], now=c.clock.now())
        await signed(http, c, "vic")
        held = (await http.get("/api/v1/flows/stripe", headers=op)).json()
        assert held["held_until"] is not None
        assert "a 429 with Retry-After from job" in held["held_reason"]
        assert "a 429 with Retry-After" in (await http.get("/ui/flows")).text

        c.clock.advance(30)  # type: ignore[attr-defined]
        assert [(f.held_until, f.held_reason) for f in await c.flows("a")] == [(None, None)]
        assert (await c.flow("a", "stripe"))[0].held_until is None
        [listed] = (await http.get("/api/v1/flows", headers=op)).json()
        shown = (await http.get("/api/v1/flows/stripe", headers=op)).json()
        body = {"parallelism": 2}
        changed = (await http.patch("/api/v1/flows/stripe", json=body, headers=op)).json()
        for found in (listed, shown, changed):
            assert (found["held_until"], found["held_reason"]) == (None, None)
        page = (await http.get("/ui/flows")).text
        assert "a 429 with Retry-After" not in page
        assert "not held" in page
