"""Each tenant's place in the fair share of claims (tables.tenant_shares; the decision is
corral.shares): which tenants have jobs waiting, their turns and the clock, and a claim's
moves on them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy import Connection, func, select, text

from corral.shares import Places
from corral.store import dialects, statements
from corral.store.tables import tenant_shares

_WAITING = text(f"WITH RECURSIVE {statements.TENANTS_WAITING} SELECT tenant FROM waiting")


def tenants_waiting(conn: Connection) -> list[str]:
    """The tenants with queued or scheduled jobs (statements.TENANTS_WAITING)."""
    return sorted(conn.execute(_WAITING).scalars())


def places_read(conn: Connection, *, tenants: Sequence[str]) -> Places:
    """The turns of `tenants` (those with one) and the clock: the newest a claim that
    served one of them reached. (A tenant back from a pause brings an old clock, the
    others waiting a new one.)"""
    rows = conn.execute(
        select(tenant_shares.c.tenant, tenant_shares.c.turn, tenant_shares.c.clock).where(
            tenant_shares.c.tenant.in_(list(tenants))
        )
    ).all()
    clock = max((row.clock for row in rows), default=0.0)
    return Places({row.tenant: row.turn for row in rows}, float(clock))


def places_move(
    conn: Connection, *, places: Places, added: Mapping[str, float], reached: float
) -> None:
    """Move each tenant of `added` on by its amount from where it stood (its turn, or the
    clock `places` read if that is later: taken from the row as it is now, so two claims
    at once both count), and the clock on to `reached`."""
    if not added:
        return
    latest = func.greatest if conn.dialect.name == "postgresql" else func.max
    stmt = dialects.upsert(conn, tenant_shares)
    stmt = stmt.on_conflict_do_update(
        index_elements=["tenant"],
        set_={
            "turn": latest(tenant_shares.c.turn, places.clock)
            + (stmt.excluded.turn - places.clock),
            "clock": latest(tenant_shares.c.clock, stmt.excluded.clock),
        },
    )
    conn.execute(
        stmt,
        [
            {"tenant": t, "turn": places.clock + n, "clock": reached}
            for t, n in sorted(added.items())  # locked in one order by every claim
        ],
    )
