"""FencedTable: rows in your own database that a stale attempt cannot overwrite.

Every attempt carries a fence (its attempt id: it only grows). The table keeps, on each
row, the fence of the attempt that wrote it; an upsert applies to a row only when its
fence is at least the stored one, in one statement:

    INSERT INTO daily_totals (day, total, fence, code_version) VALUES (...)
    ON CONFLICT (day) DO UPDATE SET total = excluded.total, fence = excluded.fence, ...
    WHERE daily_totals.fence <= excluded.fence

so attempt 7, resumed after attempt 8 wrote, changes nothing, whatever the interleaving.
An equal fence applies (the same attempt writing again is idempotent).

    from corral.sinks import FencedTable

    totals = FencedTable("postgresql+psycopg://...", "daily_totals", key=["day"])
    result = totals.upsert([{"day": "2026-11-30", "total": 42}])   # fence from CORRAL_FENCE
    result.applied, result.refused

The table needs two columns beside yours: `fence BIGINT NOT NULL DEFAULT 0` and
`code_version TEXT` (`add_fence_columns` adds them), and a unique key on `key`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from corral import errors
from corral.sinks.fence import Writer, writer

FENCE, CODE_VERSION = "fence", "code_version"


@dataclass(frozen=True, slots=True)
class UpsertResult:
    """How many rows of one upsert applied, and how many a newer fence kept out."""

    applied: int
    refused: int


def fence_columns() -> list[sa.Column[Any]]:
    """The two columns a fenced table needs, for a table you define with SQLAlchemy."""
    return [
        sa.Column(FENCE, sa.BigInteger, nullable=False, server_default="0"),
        sa.Column(CODE_VERSION, sa.Text, nullable=True),
    ]


def add_fence_columns(engine: sa.Engine | str, table: str, *, schema: str | None = None) -> None:
    """Add `fence` and `code_version` to an existing table (those it lacks). Rows already
    there get fence 0, so any attempt may overwrite them once."""
    engine = _engine(engine)
    have = {c["name"] for c in sa.inspect(engine).get_columns(table, schema=schema)}
    name = engine.dialect.identifier_preparer.quote(table)
    if schema is not None:
        name = f"{engine.dialect.identifier_preparer.quote_schema(schema)}.{name}"
    with engine.begin() as conn:
        if FENCE not in have:
            conn.execute(
                sa.text(f"ALTER TABLE {name} ADD COLUMN {FENCE} BIGINT NOT NULL DEFAULT 0")
            )
        if CODE_VERSION not in have:
            conn.execute(sa.text(f"ALTER TABLE {name} ADD COLUMN {CODE_VERSION} TEXT"))


class FencedTable:
    """A table in your database whose rows only the newest attempt may change."""

    def __init__(
        self,
        engine: sa.Engine | str,
        table: str | sa.Table,
        *,
        key: Sequence[str],
        schema: str | None = None,
    ) -> None:
        self.engine = _engine(engine)
        if self.engine.dialect.name not in ("sqlite", "postgresql"):
            raise errors.ConfigError(
                f"FencedTable: {self.engine.dialect.name} is not supported (sqlite, postgresql)"
            )
        self.table = (
            table
            if isinstance(table, sa.Table)
            else sa.Table(table, sa.MetaData(), schema=schema, autoload_with=self.engine)
        )
        self.key = list(key)
        names = set(self.table.c.keys())
        if missing := [c for c in (*self.key, FENCE, CODE_VERSION) if c not in names]:
            raise errors.ConfigError(
                f"FencedTable {self.table.name}: no column {', '.join(missing)}"
                + (" (add them with corral.sinks.add_fence_columns)" if FENCE in missing else "")
            )
        if not self.key:
            raise errors.ConfigError(f"FencedTable {self.table.name}: key names no column")

    def close(self) -> None:
        """Close this table's database connections."""
        self.engine.dispose()

    def upsert(
        self,
        rows: Iterable[Mapping[str, Any]],
        *,
        fence: int | None = None,
        code_version: str | None = None,
        strict: bool = False,
    ) -> UpsertResult:
        """Insert or update `rows` (by the key) as attempt `fence` (default: this
        process's CORRAL_FENCE). Rows whose stored fence is newer stay as they are and
        count as refused; with `strict`, any refusal writes nothing and raises
        StaleFenceError naming both fences."""
        who = writer(fence, code_version)
        batch = self._rows(rows, who)
        if not batch:
            return UpsertResult(0, 0)
        statement = self._statement(batch)
        with self.engine.begin() as conn:
            applied = len(conn.execute(statement).all())
            refused = len(batch) - applied
            if refused and strict:
                newest = conn.execute(
                    sa.select(sa.func.max(self.table.c[FENCE])).where(self._keys_in(batch))
                ).scalar_one()
                conn.rollback()
                raise errors.StaleFenceError(
                    f"{self.table.name}: {refused} of {len(batch)} rows hold fence {newest},"
                    f" newer than this attempt's {who.fence}; nothing was written",
                    fence=who.fence,
                    newer=int(newest),
                )
        return UpsertResult(applied, refused)

    def _rows(self, rows: Iterable[Mapping[str, Any]], who: Writer) -> list[dict[str, Any]]:
        batch, seen = [], set()
        columns = set(self.table.c.keys())
        for row in rows:
            if unknown := sorted(set(row) - columns):
                raise errors.InvalidInput(f"{self.table.name}: no column {', '.join(unknown)}")
            if FENCE in row or CODE_VERSION in row:
                raise errors.InvalidInput(
                    f"{self.table.name}: {FENCE} and {CODE_VERSION} are set by the sink"
                )
            try:
                key = tuple(row[k] for k in self.key)
            except KeyError as exc:
                raise errors.InvalidInput(
                    f"{self.table.name}: a row has no key column {exc.args[0]}"
                ) from None
            if key in seen:
                raise errors.InvalidInput(f"{self.table.name}: key {key} twice in one upsert")
            seen.add(key)
            batch.append({**row, FENCE: who.fence, CODE_VERSION: who.code_version})
        if batch and any(set(row) != set(batch[0]) for row in batch):
            raise errors.InvalidInput(f"{self.table.name}: every row must set the same columns")
        # Rows in key order: two attempts writing the same keys lock them in the same order
        # (a refused row is still locked on PostgreSQL), so they wait instead of deadlocking.
        batch.sort(key=lambda row: tuple(str(row[k]) for k in self.key))
        return batch

    def _statement(self, batch: list[dict[str, Any]]) -> Any:
        dialect = postgresql if self.engine.dialect.name == "postgresql" else sqlite
        insert = dialect.insert(self.table).values(batch)
        columns = sorted(set().union(*batch) - set(self.key))
        return insert.on_conflict_do_update(
            index_elements=[self.table.c[k] for k in self.key],
            set_={c: insert.excluded[c] for c in columns},
            where=self.table.c[FENCE] <= insert.excluded[FENCE],
        ).returning(*(self.table.c[k] for k in self.key))

    def _keys_in(self, batch: list[dict[str, Any]]) -> Any:
        keys = [tuple(row[k] for k in self.key) for row in batch]
        return sa.tuple_(*(self.table.c[k] for k in self.key)).in_(keys)


def _engine(engine: sa.Engine | str) -> sa.Engine:
    return sa.create_engine(engine) if isinstance(engine, str) else engine
