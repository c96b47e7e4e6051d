"""Schedules kept as code: a `Schedule` document has the fields of a schedule's API body
(`POST /api/v1/schedules`: its rule, its options and its job template), checked as that
body is (client.bodies, client.schedules), and is what a schedule of its tenant holds.

Its secrets (a header's value, a URL's password or token) are exported as KEPT, as
corral.redaction hides them everywhere else. A document without `start` keeps the
schedule's own (its interval's origin); an export writes it for an interval, and for a
cron expression when one was given. Its `flow` may be one a `Flow` document of the same
apply makes: flows are written first, and the flow is checked again in the transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from corral import documents, durations, model, quotas, redaction, scheduling, store
from corral.client import apply_kinds, bodies, schedules

PAGE = 1000
"""The schedules read at once."""
_DEFAULTS = {
    "tz": "UTC",
    "catchup": "none",
    "catchup_window": "7d",
    "catchup_max": 100,
    "overlap": "allow",
    "queue": "default",
    "priority": 0,
}
"""A document's fields that are left out when they are their default."""


def fields_of(s: scheduling.NewSchedule | scheduling.Schedule, anchor: datetime) -> dict[str, Any]:
    """A schedule (made or stored) as a document's fields: those at their default, and
    those the template leaves empty (but its spec), left out."""
    found: dict[str, Any] = {}
    if s.cron is not None:
        found["cron"] = s.cron
    else:
        found["every"] = durations.format_duration(timedelta(seconds=s.every_seconds or 0))
    found["tz"] = s.tz
    found["start"] = model.iso(anchor)
    found["until"] = model.iso(s.until) if s.until else None
    found["catchup"] = s.catchup.value
    found["catchup_window"] = durations.format_duration(timedelta(seconds=s.catchup_window_seconds))
    found["catchup_max"] = s.catchup_max
    found["overlap"] = s.overlap.value
    found["jitter"] = (
        durations.format_duration(timedelta(seconds=s.jitter_seconds)) if s.jitter_seconds else None
    )
    found["pause_after"] = s.pause_after
    found.update({k: v for k, v in s.template.items() if k != "tenant"})
    return {
        k: v
        for k, v in found.items()
        if v is not None
        and (v != {} or k == "spec")  # a spec is required, even an empty one
        and not (k in _DEFAULTS and _DEFAULTS[k] == v)
    }


class ScheduleKind(apply_kinds.Kind):
    """`kind: Schedule`."""

    name = "Schedule"
    what = "schedule"

    async def held(self, c: apply_kinds.Services, tenant: str) -> dict[str, apply_kinds.Held]:
        found: list[scheduling.Schedule] = []
        after: tuple[str, str] | None = None
        while True:
            page = await c.store.schedules.list(tenant=tenant, limit=PAGE, after=after)
            found.extend(page)
            if len(page) < PAGE:
                break
            after = (page[-1].tenant, page[-1].name)
        return {s.name: apply_kinds.Held(s.name, fields_of(s, s.anchor), s) for s in found}

    async def wanted(
        self,
        c: apply_kinds.Services,
        doc: documents.Document,
        tenant: str,
        held: apply_kinds.Held | None,
        *,
        limited: bool,
        named: apply_kinds.Named,
    ) -> apply_kinds.Wanted:
        given = self.restored(doc.fields, held)
        old: scheduling.Schedule | None = held.stored if held else None
        args = bodies.schedule_arguments(
            {**given, "name": doc.name, "tenant": tenant}, acts_for=None, creating=True
        )
        args.pop("name")
        if limited:  # as a tenant's schedule made through the API is
            spec = bodies.granted(c, tenant, args)
            if "spec" in args:
                args["spec"] = spec
        if old is not None and "start" not in given:
            args["start"] = old.anchor  # an interval's origin stays
        tenant_made = limited or (old is not None and old.tenant_made)
        new, anchor, first = await c.schedule_prepared(
            doc.name,
            recorded=old.last_nominal if old else None,
            flows_made=named.get("Flow", ()),  # made first, in the same transaction
            tenant_made=tenant_made,
            **args,
        )
        where = (doc.where, self.what, tenant, doc.name)
        write: store.manifests.Write
        if old is None:
            quota = quotas.limits(c.settings.tenants, tenant) if limited else None
            write = store.manifests.ScheduleMade(*where, new, anchor, first, quota)
        else:
            changes = schedules.changes_of(new)
            write = store.manifests.ScheduleChanged(*where, old.id, changes, first)
        return apply_kinds.Wanted(fields_of(new, anchor), write)

    def exported(self, held: apply_kinds.Held) -> dict[str, Any]:
        found = dict(redaction.redacted(dict(held.fields), documents.KEPT))
        stored: scheduling.Schedule = held.stored
        if stored.every_seconds is None and stored.anchor == stored.created_at.replace(
            microsecond=0
        ):
            found.pop("start", None)  # made without one: it says nothing
        return found

    def restored(self, given: Mapping[str, Any], held: apply_kinds.Held | None) -> dict[str, Any]:
        return apply_kinds.restored_secrets(given, held, "schedule")
