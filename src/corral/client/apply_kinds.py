"""What a kind of object kept as code (`corral apply`) is to the client: how it reads a
tenant's objects as documents' fields, checks a document with the checks the CLI and the
API use for that kind (never a second set), and says the write that makes or changes it.

One class per kind, each in the module of its noun (apply_flows.py, apply_schedules.py,
apply_monitors.py, apply_alerts.py), and the one table of them in client/apply.py (KINDS),
with its writes in store/manifests.py: it reads its objects (`held`), checks a document
(`wanted`, which also sees the names the apply's other documents give: a schedule may name
a flow the same apply makes), and says which of its fields are secret (`exported`,
`restored`).
"""

from __future__ import annotations

import abc
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from corral import documents, errors, redaction, store
from corral.client import flows, monitors, schedules, tenant_alerts


class Services(schedules.Schedules, tenant_alerts.TenantAlerts, monitors.Monitors, flows.Flows):
    """The services of the client the kinds read and check with."""


Named = Mapping[str, Collection[str]]
"""The names an apply's documents give, by kind (as documents name it: "Flow")."""


@dataclass(frozen=True, slots=True)
class Held:
    """An object of a tenant as stored: its fields as a document says them (secrets
    whole), and what the kind's writes need of it (`stored`: the schedule, the monitor)."""

    name: str
    fields: Mapping[str, Any]
    stored: Any = None


@dataclass(frozen=True, slots=True)
class Wanted:
    """An object as a document says it, checked: its fields as `Held.fields` are said (so
    the two compare), and the write that makes it so."""

    fields: Mapping[str, Any]
    write: store.manifests.Write


class Kind(abc.ABC):
    """A kind of object kept as code. `name` as documents name it, `what` as the store's
    plan does (a key of store.manifests.TABLES)."""

    name: ClassVar[str]
    what: ClassVar[str]

    @abc.abstractmethod
    async def held(self, c: Services, tenant: str) -> dict[str, Held]:
        """`tenant`'s objects of this kind, by name."""

    @abc.abstractmethod
    async def wanted(
        self,
        c: Services,
        doc: documents.Document,
        tenant: str,
        held: Held | None,
        *,
        limited: bool,
        named: Named,
    ) -> Wanted:
        """`doc` checked, as `tenant`'s (`held`: as stored now, None: to be made);
        InvalidInput naming the field and the rule. `limited`: a tenant's request (the API),
        checked and held to quotas as the tenant's own requests for this kind are. `named`:
        the objects the apply's documents give, made before this one if it names them."""

    def exported(self, held: Held) -> dict[str, Any]:
        """What an export writes of `held`: its fields, each secret as KEPT."""
        return dict(held.fields)

    def restored(self, given: Mapping[str, Any], held: Held | None) -> dict[str, Any]:
        """A document's fields with each KEPT where `exported` puts one replaced by the
        stored value; InvalidInput naming the field for a KEPT with none stored behind it."""
        return dict(given)


def kept_nothing(field: str, what: str) -> errors.InvalidInput:
    """The refusal of a KEPT with no stored value behind it."""
    return errors.InvalidInput(
        f"{field}: {documents.KEPT!r} keeps the value stored, and this {what} has none"
        " stored there yet: give the value"
    )


def restored_secrets(given: Mapping[str, Any], held: Held | None, what: str) -> dict[str, Any]:
    """`given` with each KEPT where corral.redaction hides a secret (a secret-named key, a
    URL's password or secret-named parameter) replaced by `held`'s value there."""
    found = redaction.restored(dict(given), dict(held.fields) if held else {}, documents.KEPT)
    if (path := redaction.left(found, documents.KEPT)) is not None:
        raise kept_nothing(path, what)
    return dict(found)
