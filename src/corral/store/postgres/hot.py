"""PostgreSQL's hot path as one object (store/hotpath.HotPath): its statements are
coroutines on the hot path's own async connections, each its own transaction."""

from __future__ import annotations

from corral.store.postgres import claim as claiming
from corral.store.postgres import settle as settling


class PostgresHotPath:
    """The claim, a worker's claim and the settle, one statement each."""

    claim = staticmethod(claiming.pg_claim)
    worker_claim = staticmethod(claiming.pg_worker_claim)
    settle = staticmethod(settling.pg_settle)
