"""Objects kept as code: `apply` makes a tenant's flows, schedules, monitors, alert
channels and rules what documents say (corral.documents), in one transaction, and says what
it did to each (create, change with the fields that change, delete, unchanged); `export`
writes what a tenant has as documents that apply reads back as nothing to do.

Every document is checked first, each with the checks of its kind (client.apply_kinds),
and a bad one refuses the whole plan, naming its file, its number, its name and the field.
Objects apply makes or changes are marked managed; with `prune`, the managed objects that
no document holds any longer are deleted (one made by hand never is). An object made by
hand that a document names is taken over (`adopted`): marked managed in the transaction,
and, when the document says it as it is, unchanged in the plan, so an export applied again
has nothing to do.

KINDS is the one table of kinds, in the order they are written: an object is written
after those it names (a schedule after its flow, a rule after its channels, a monitor after
the channels of its rule), and deleted before them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from corral import documents, errors, store
from corral.client import apply_alerts, apply_flows, apply_kinds, apply_monitors, apply_schedules

A = documents.Action

KINDS: tuple[apply_kinds.Kind, ...] = (
    apply_flows.FlowKind(),
    apply_alerts.ChannelKind(),
    apply_alerts.RuleKind(),
    apply_monitors.MonitorKind(),
    apply_schedules.ScheduleKind(),
)
"""Every kind apply reads and export writes, in the order they are written."""
NAMES = tuple(k.name for k in KINDS)
MAX_DOCUMENTS = 1000
"""The most documents one apply takes."""
MAX_PROBLEMS = 20
"""The most refusals of documents one refused apply lists."""


def documents_of(body: Mapping[str, Any]) -> list[documents.Document]:
    """The documents of `POST /api/v1/apply`'s body: `documents`, a list of objects (each
    numbered in "documents"), or `files`, a list of {"name", "text"} read as files are."""
    given, files = body.get("documents"), body.get("files")
    if (given is None) == (files is None):
        raise errors.InvalidInput("documents: give documents (a list of objects) or files")
    if given is not None:
        if not isinstance(given, list):
            raise errors.InvalidInput("documents: a list of objects, each with kind and name")
        return [documents.document(raw, "documents", i) for i, raw in enumerate(given, start=1)]
    if not isinstance(files, list) or not all(
        isinstance(f, dict) and isinstance(f.get("name"), str) and isinstance(f.get("text"), str)
        for f in files
    ):
        raise errors.InvalidInput('files: a list of {"name": "x.yaml", "text": "..."}')
    return [doc for f in files for doc in documents.parse(f["text"], f["name"])]


def _refused(doc: documents.Document, tenant: str) -> str | None:
    """Why a document cannot be applied to `tenant` whatever its fields, or None."""
    if doc.kind not in NAMES:
        return f"kind: {doc.kind!r} is not one of {', '.join(NAMES)}"
    if doc.tenant not in (None, tenant):
        return (
            f"tenant: {doc.tenant!r} is not the tenant applied to ({tenant!r}): apply it to"
            " its own tenant, or leave tenant out"
        )
    return None


class Apply(apply_kinds.Services):
    """Apply documents to a tenant's objects; export them."""

    async def apply(
        self,
        tenant: str,
        given: Sequence[documents.Document],
        *,
        prune: bool = False,
        dry_run: bool = False,
        limited: bool = False,
    ) -> list[documents.Step]:
        """Make `tenant`'s objects what `given` says, in one transaction (`dry_run`: then
        undone), each object's step sorted by kind and name. InvalidInput names every bad
        document (file, number, name, field), and nothing is written. `prune`: delete the
        managed objects no document holds. `limited`: a tenant's request (the API), checked
        and held to quotas as its own requests of each kind are."""
        if len(given) > MAX_DOCUMENTS:
            raise errors.InvalidInput(f"documents: at most {MAX_DOCUMENTS} in one apply")
        documents.twins(given)
        problems = [f"{d.where}: {why}" for d in given if (why := _refused(d, tenant))]
        if problems:
            raise errors.InvalidInput("\n".join(problems[:MAX_PROBLEMS]))
        steps, writes = await self._plan(tenant, given, prune=prune, limited=limited)
        if writes:
            await self.store.manifests.apply(
                tenant=tenant, writes=writes, now=self.clock.now(), dry_run=dry_run
            )
        order = {name: i for i, name in enumerate(NAMES)}
        return sorted(steps, key=lambda s: (order[s.kind], s.name))

    async def _plan(
        self, tenant: str, given: Sequence[documents.Document], *, prune: bool, limited: bool
    ) -> tuple[list[documents.Step], list[store.manifests.Write]]:
        """Each object's step, and the writes: makes and changes kind by kind in KINDS'
        order, then deletes in the other order. InvalidInput names every bad document (up
        to MAX_PROBLEMS), in the order given."""
        managed = await self.store.manifests.managed(tenant=tenant)
        named = {k.name: {d.name for d in given if d.kind == k.name} for k in KINDS}
        steps: list[documents.Step] = []
        writes: list[store.manifests.Write] = []
        deletes: list[store.manifests.Write] = []
        problems: list[tuple[int, str]] = []  # (its place among the documents, the refusal)
        for kind in KINDS:
            mine = [d for d in given if d.kind == kind.name]
            if not mine and not (prune and managed[kind.what]):
                continue
            held = await kind.held(self, tenant)
            for doc in mine:
                try:
                    by_hand = doc.name not in managed[kind.what]
                    step, write = await self._planned(
                        kind, doc, tenant, held, by_hand, limited, named
                    )
                except errors.InvalidInput as exc:
                    problems.append((given.index(doc), str(documents.located(exc, doc.where))))
                    continue
                except errors.CorralError as exc:
                    raise documents.located(exc, doc.where) from exc
                steps.append(step)
                writes.extend([write] if write else [])
            if prune:
                gone = sorted((managed[kind.what] & set(held)) - {d.name for d in mine})
                steps.extend(documents.Step(A.DELETE, kind.name, name) for name in gone)
                deletes[:0] = [_deleted(kind, tenant, name) for name in gone]
        if problems:
            said = [why for _, why in sorted(problems)[:MAX_PROBLEMS]]
            raise errors.InvalidInput("\n".join(said))
        return steps, [*writes, *deletes]

    async def _planned(
        self,
        kind: apply_kinds.Kind,
        doc: documents.Document,
        tenant: str,
        held: Mapping[str, apply_kinds.Held],
        by_hand: bool,
        limited: bool,
        named: apply_kinds.Named,
    ) -> tuple[documents.Step, store.manifests.Write | None]:
        """One document's step, and its write (None: nothing to do). `by_hand`: no managed
        object of the kind has its name, so one stored is taken over (`adopted`), and marked
        managed even when the document says it as it is."""
        stored = held.get(doc.name)
        wanted = await kind.wanted(self, doc, tenant, stored, limited=limited, named=named)
        if stored is None:
            return documents.Step(A.CREATE, kind.name, doc.name), wanted.write
        fields = tuple(documents.changed(wanted.fields, stored.fields))
        action = A.CHANGE if fields else A.UNCHANGED
        step = documents.Step(action, kind.name, doc.name, fields, adopted=by_hand)
        if fields:
            return step, wanted.write
        if by_hand:  # as the document says: only the mark is written
            return step, store.manifests.Write(doc.where, kind.what, tenant, doc.name)
        return step, None

    async def export(self, tenant: str, kinds: Sequence[str] = ()) -> list[dict[str, Any]]:
        """`tenant`'s objects (of `kinds`; none named: of every kind) as documents, by kind
        and name, each secret as KEPT: applied as they are, they change nothing."""
        if unknown := sorted(set(kinds) - set(NAMES)):
            raise errors.InvalidInput(f"kind: {unknown[0]!r} is not one of {', '.join(NAMES)}")
        found = []
        for kind in KINDS:
            if kinds and kind.name not in kinds:
                continue
            held = await kind.held(self, tenant)
            for name in sorted(held):
                found.append({"kind": kind.name, "name": name, **kind.exported(held[name])})
        return found


def _deleted(kind: apply_kinds.Kind, tenant: str, name: str) -> store.manifests.Write:
    where = f"--prune: {kind.name} {name!r}"
    return store.manifests.Deleted(where, kind.what, tenant, name)
