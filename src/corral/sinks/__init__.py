"""Fenced sinks: how a job's effects stay exactly-once when corral launches at least once.

An orchestrator cannot tell a dead attempt from a slow one, so a relaunched attempt may run
beside its original. Each attempt carries a fence (its attempt id, which only grows), and
these sinks refuse what a stale one writes. See the README, "Exactly-once effects".
"""

from corral.sinks.checkpoint import (
    load_checkpoint,
    load_checkpoint_async,
    save_checkpoint,
    save_checkpoint_async,
)
from corral.sinks.fence import Writer, writer
from corral.sinks.publish import (
    MinRows,
    Publisher,
    UniqueKeys,
    resolve,
    resolve_async,
    rows_of,
)
from corral.sinks.table import FencedTable, UpsertResult, add_fence_columns, fence_columns

__all__ = [
    "FencedTable",
    "MinRows",
    "Publisher",
    "UniqueKeys",
    "UpsertResult",
    "Writer",
    "add_fence_columns",
    "fence_columns",
    "load_checkpoint",
    "load_checkpoint_async",
    "resolve",
    "resolve_async",
    "rows_of",
    "save_checkpoint",
    "save_checkpoint_async",
    "writer",
]
