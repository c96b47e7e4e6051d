"""Flows kept as code: a `Flow` document has a flow's limits (`rate`, N/PERIOD; and
`parallelism`), checked as `corral flows add` and POST /api/v1/flows check them
(corral.flows), and is what a flow of its tenant holds. A limit the document leaves out is
none: the document says the whole flow. A flow's hold (a Retry-After) is its state, not a
field: apply neither writes nor clears it.

Flows come first in client/apply.KINDS: made before the schedules that name them, deleted
after them (and a flow a schedule or an unfinished job still names is not deleted: the
whole apply is refused, store/flows.py).
"""

from __future__ import annotations

from typing import Any

from corral import documents, errors, store
from corral import flows as flow_rules  # the client's `flows` is a method
from corral.client import apply_kinds

LIMITS = ("rate", "parallelism")
"""A Flow document's fields."""


def fields_of(rate: flow_rules.Rate | None, parallelism: int | None) -> dict[str, Any]:
    """A flow's limits (checked or stored) as a document's fields, none left out."""
    found: dict[str, Any] = {}
    if rate is not None:
        found["rate"] = str(rate)
    if parallelism is not None:
        found["parallelism"] = parallelism
    return found


class FlowKind(apply_kinds.Kind):
    """`kind: Flow`."""

    name = "Flow"
    what = "flow"

    async def held(self, c: apply_kinds.Services, tenant: str) -> dict[str, apply_kinds.Held]:
        return {
            f.name: apply_kinds.Held(f.name, fields_of(f.rate, f.parallelism), f)
            for f in await c.flows(tenant)
        }

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
        name = flow_rules.name_checked(doc.name)
        if unknown := sorted(set(doc.fields) - set(LIMITS)):
            raise errors.InvalidInput(
                f"{unknown[0]}: unknown field (a Flow has {' and '.join(LIMITS)})"
            )
        given = flow_rules.limits_of(doc.fields)
        left_out = frozenset(k for k in LIMITS if getattr(given, k) is None)
        limits = flow_rules.Limits(given.rate, given.parallelism, clear=left_out)
        where = (doc.where, self.what, tenant, name)
        write: store.manifests.Write
        if held is None:
            write = store.manifests.FlowMade(*where, limits, flow_rules.MAX_FLOWS)
        else:
            write = store.manifests.FlowChanged(*where, limits)
        return apply_kinds.Wanted(fields_of(limits.rate, limits.parallelism), write)
