"""SQLite's hot path as one object (store/hotpath.HotPath): its statements run inside the
caller's transaction on the store's one writer thread. A worker's claim has no statement of
its own here: the general one (workers.worker_claim) costs no round trip on a file."""

from __future__ import annotations

from corral.store import workers
from corral.store.sqlite import claim as claiming
from corral.store.sqlite import settle as settling


class SqliteHotPath:
    """The claim and the settle as a few prepared statements each; a worker's claim by the
    general path."""

    claim = staticmethod(claiming.sqlite_claim)
    worker_claim = staticmethod(workers.worker_claim)
    settle = staticmethod(settling.sqlite_settle)
