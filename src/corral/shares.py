"""Fair shares: how a claim divides the due jobs among tenants. A pure decision: the store
reads and writes each tenant's place (store/shares.py), and PostgreSQL's claim says the
same in SQL (store/postgres/claim.py).

Stride scheduling. Each tenant has a turn, how far its share has gone; each job claimed
moves it on by 1 / the tenant's weight. A claim takes the due jobs in the order of the turn
each would be taken at: its tenant's turn, plus its place among that tenant's own due jobs
(most urgent first) over the weight. So over many claims, large or of one job, each tenant
waiting gets jobs in proportion to its weight however deep another's backlog, and a
tenant's priorities order only its own jobs. A tenant that had nothing due starts from the
clock (the turn the newest claim reached), never from behind it: a pause earns no burst.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import groupby

ANY = "*"
"""The key of the weight every tenant not named has."""


@dataclass(frozen=True, slots=True)
class Weights:
    """Each tenant's weight (`[tenants.NAME] weight`); `default` for the others."""

    named: Mapping[str, float] = field(default_factory=dict)
    default: float = 1.0

    def of(self, tenant: str) -> float:
        return self.named.get(tenant, self.default)


@dataclass(frozen=True, slots=True)
class Due:
    """A due job a claim could take (`waited`: it is scheduled and its time has come)."""

    id: int
    tenant: str
    priority: int
    run_at: datetime
    waited: bool = False


@dataclass(frozen=True, slots=True)
class Places:
    """The tenants' stored turns and the clock (the newest turn a claim reached)."""

    turns: Mapping[str, float] = field(default_factory=dict)
    clock: float = 0.0

    def start(self, tenant: str) -> float:
        """Where `tenant`'s next job stands: its turn, or the clock if that is later."""
        return max(self.turns.get(tenant, self.clock), self.clock)


def urgency(job: Due) -> tuple[int, datetime, int]:
    """The order of a tenant's own due jobs: highest priority, then longest due, first."""
    return (-job.priority, job.run_at, job.id)


def in_turn(due: Iterable[Due], places: Places, weights: Weights) -> list[tuple[float, Due]]:
    """Each due job with the turn it would be taken at, in the order a claim takes them
    (ties: the longest due first). A job given twice (by two reads) counts once."""
    unique = {job.id: job for job in due}.values()
    out: list[tuple[float, Due]] = []
    for tenant, own in groupby(sorted(unique, key=lambda j: j.tenant), key=lambda j: j.tenant):
        start, weight = places.start(tenant), weights.of(tenant)
        out += [(start + place / weight, job) for place, job in enumerate(sorted(own, key=urgency))]
    out.sort(key=lambda turned: (turned[0], turned[1].run_at, turned[1].id))
    return out


def moved_on(
    taken: Sequence[tuple[float, Due]], weights: Weights
) -> tuple[dict[str, float], float]:
    """What a claim that took `taken` (in turn) adds to each tenant's turn (1 / weight a
    job), and the turn it reached (the clock's next value)."""
    counts: dict[str, int] = {}
    for _, job in taken:
        counts[job.tenant] = counts.get(job.tenant, 0) + 1
    return {t: n / weights.of(t) for t, n in counts.items()}, max(turn for turn, _ in taken)


def fair_part(limit: int, mine: Iterable[str], others: Mapping[str, int], weights: Weights) -> int:
    """How many of a claim's `limit` jobs may go to the tenants `mine` while the tenants of
    `others` wait too, each with as many jobs due as it says (counted up to `limit`): the
    part their weights make of all theirs, rounded up and at least one, or all the room
    the others' jobs leave, if more. The flow claim's part of a tick's room
    (store/flow_claims.py): the rest is the main claim's."""
    own = set(mine)
    rest = {t: n for t, n in others.items() if n > 0 and t not in own}
    if limit <= 0:
        return 0
    weighed = sum(weights.of(t) for t in own)
    weighed_rest = sum(weights.of(t) for t in rest)
    if weighed_rest <= 0:
        return limit
    part = max(1, math.ceil(limit * weighed / (weighed + weighed_rest)))
    return min(limit, max(part, limit - sum(rest.values())))
