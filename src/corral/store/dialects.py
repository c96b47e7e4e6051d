"""The few places SQLite and PostgreSQL differ: engine set-up, row locks, insert-or-ignore.

Every PostgreSQL connection carries time limits (ConnectionLimits, from the database_*
settings), so that a slow or silent network turns into an error within a known time
instead of a process that stands still: libpq's connect timeout, TCP keepalives and
tcp_user_timeout on corral's side; statement, lock and idle-in-transaction timeouts and the
same TCP limits on the server's side, so the server too notices a client that was cut off
and ends its transaction, releasing the row locks that would hold up everyone else.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Connection,
    DateTime,
    Engine,
    Float,
    Integer,
    Select,
    Table,
    and_,
    any_,
    bindparam,
    create_engine,
    event,
    exists,
    func,
    or_,
    select,
    tuple_,
)
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.elements import BindParameter, ClauseElement, ColumnElement

from corral import durations
from corral.timeouts import Timeouts

SQLITE_BUSY_TIMEOUT_MS = 30_000


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The time limits of corral's PostgreSQL connections (the timeouts.database_* settings)."""

    connect: timedelta
    tcp: timedelta
    statement: timedelta
    lock: timedelta
    idle_in_transaction: timedelta
    transaction: timedelta

    @classmethod
    def of(cls, timeouts: Timeouts) -> ConnectionLimits:
        return cls(
            connect=timeouts.database_connect_timeout,
            tcp=timeouts.database_tcp_timeout,
            statement=timeouts.database_statement_timeout,
            lock=timeouts.database_lock_timeout,
            idle_in_transaction=timeouts.database_idle_timeout,
            transaction=timeouts.database_transaction_timeout,
        )

    def setting(self, limit: str) -> str:
        """The setting one of these limits comes from, and its value: for messages."""
        name = "idle" if limit == "idle_in_transaction" else limit
        return (
            f"timeouts.database_{name}_timeout, {durations.format_duration(getattr(self, limit))}"
        )


_OWN_PARAMETERS = {
    "connect_timeout": "database_connect_timeout",
    "keepalives": "database_tcp_timeout",
    "keepalives_idle": "database_tcp_timeout",
    "keepalives_interval": "database_tcp_timeout",
    "keepalives_count": "database_tcp_timeout",
    "tcp_user_timeout": "database_tcp_timeout",
}
"""libpq parameters corral sets itself, and the setting each comes from."""


def engine_create(url: str, limits: ConnectionLimits | None = None) -> Engine:
    """An Engine for `url`; SQLite gets WAL, a busy timeout and write-locking transactions,
    PostgreSQL `limits` on every connection (default: those of the default settings)."""
    parsed = _parsed(url)
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(parsed)
    args = _pg_args(parsed, limits)
    # No ping at checkout (a round trip per transaction): a connection that broke while it
    # sat in the pool fails its first statement, and the Database tries that once more on
    # a fresh one (Database._run); SQLAlchemy then replaces every older pooled connection.
    return create_engine(parsed, pool_size=5, max_overflow=5, connect_args=args)


def hot_params(engine: Engine, limits: ConnectionLimits | None = None) -> dict[str, Any]:
    """libpq parameters for the hot path's own connections (hotpool.py) to `engine`'s
    PostgreSQL database: the engine's, with sequential scans priced out. The hot path's
    statements find every row by a key and are prepared once they repeat; a prepared
    statement's generic plan is made from the statistics of the moment, and made on a
    fresh database (tables of a few rows, that will hold millions) it would scan the
    tables it should look up in, for as long as the connection lives. No JIT: a scan priced
    out (of a table that is only ever small, as tenant_shares) prices the whole statement
    past the JIT's thresholds, and compiling a claim costs a second where running it costs
    a millisecond."""
    _, params = engine.dialect.create_connect_args(engine.url)
    params.pop("context", None)  # SQLAlchemy's adapters: the hot path reads psycopg's own
    params.update(_pg_args(engine.url, limits))
    params["options"] += " -c enable_seqscan=off -c jit=off"
    return dict(params)


def _parsed(url: str) -> URL:
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def _pg_args(parsed: URL, limits: ConnectionLimits | None) -> dict[str, Any]:
    """The connection parameters corral adds to a PostgreSQL URL's; ValueError if the URL
    sets one of them itself."""
    for key in parsed.query:
        if key in _OWN_PARAMETERS:
            raise ValueError(
                f"it sets {key}, which corral sets from timeouts.{_OWN_PARAMETERS[key]}:"
                " set that instead"
            )
    args = pg_connect_args(limits or ConnectionLimits.of(Timeouts()))
    given = parsed.query.get("options", ())
    # Corral's `-c` options go last: where the URL's options set the same thing, corral's win.
    args["options"] = " ".join([*([given] if isinstance(given, str) else given), args["options"]])
    return args


def pg_connect_args(limits: ConnectionLimits) -> dict[str, Any]:
    """libpq connection parameters that put `limits` on a connection, on both its ends."""
    tcp_ms = _ms(limits.tcp)
    # Keepalives count whole seconds: probe after half the TCP limit of silence, then every
    # second or so; tcp_user_timeout (milliseconds) ends the connection at the limit itself,
    # whether the silence is unanswered probes or unacknowledged data.
    idle = max(1, int(limits.tcp.total_seconds() / 2))
    interval = max(1, int(limits.tcp.total_seconds() / 10))
    count = max(1, math.ceil((limits.tcp.total_seconds() - idle) / interval))
    server = {
        "statement_timeout": _ms(limits.statement),
        "lock_timeout": _ms(limits.lock),
        "idle_in_transaction_session_timeout": _ms(limits.idle_in_transaction),
        # The server's own end of the connection: a client cut off in the middle of a
        # transaction is noticed, its transaction ended and its row locks released.
        "tcp_keepalives_idle": idle,
        "tcp_keepalives_interval": interval,
        "tcp_keepalives_count": count,
        "tcp_user_timeout": tcp_ms,
        # Times come back in UTC, as corral writes and compares them (the hot path reads
        # them from the driver as they come).
        "TimeZone": "UTC",
    }
    return {
        "connect_timeout": int(limits.connect.total_seconds()),
        "keepalives": 1,
        "keepalives_idle": idle,
        "keepalives_interval": interval,
        "keepalives_count": count,
        "tcp_user_timeout": tcp_ms,
        "options": " ".join(f"-c {name}={value}" for name, value in server.items()),
    }


def _ms(value: timedelta) -> int:
    """Whole milliseconds, at least 1: PostgreSQL reads 0 as "no limit"."""
    return max(1, round(value.total_seconds() * 1000))


def statements_unbounded(conn: Connection, *, local: bool = True) -> None:
    """PostgreSQL: lift the statement and lock timeouts for the rest of this transaction (or,
    not `local`, of this session: then statements_bounded puts them back), for work that
    may rightly take long (migrations, ANALYZE). The network limits stay."""
    if conn.dialect.name == "postgresql":
        scope = "LOCAL " if local else ""
        conn.exec_driver_sql(f"SET {scope}statement_timeout = 0")
        conn.exec_driver_sql(f"SET {scope}lock_timeout = 0")


def statements_bounded(conn: Connection) -> None:
    """Undo statements_unbounded(local=False): back to the limits the connection began with."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("RESET statement_timeout")
        conn.exec_driver_sql("RESET lock_timeout")


READ_ONLY = "corral_read_only"
"""The execution option of a connection whose transactions only read (Database.read)."""


def _sqlite_engine(url: Any) -> Engine:
    engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy, not the driver, decide when transactions begin (see "begin").
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=FULL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # Take the write lock up front: a read lock upgraded later can fail with SQLITE_BUSY
        # when two processes write at once, whatever the busy timeout. A transaction that
        # only reads (READ_ONLY) takes none: in WAL mode it reads a snapshot beside the
        # writer, neither waiting for the other.
        read_only = conn.get_execution_options().get(READ_ONLY, False)
        conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")

    return engine


def skip_locked(conn: Connection, stmt: Select[Any]) -> Select[Any]:
    """PostgreSQL: lock the picked rows and skip rows other claimers hold. SQLite has one
    writer at a time (BEGIN IMMEDIATE), so the same query needs no lock clause."""
    if conn.dialect.name == "postgresql":
        return stmt.with_for_update(skip_locked=True)
    return stmt


def take_turns(conn: Connection, name: str) -> None:
    """PostgreSQL: wait for other transactions that take turns on `name` to end (a
    transaction-scoped advisory lock). SQLite writers take turns anyway."""
    if conn.dialect.name == "postgresql":
        key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)
        conn.execute(select(func.pg_advisory_xact_lock(key)))


def lock_in_order(conn: Connection, table: Table, ids: Sequence[int]) -> None:
    """PostgreSQL: lock these rows in id order first, so two writers that update the same
    rows in different orders wait for each other instead of deadlocking. (SQLite writers
    never overlap.)"""
    if conn.dialect.name == "postgresql" and ids:
        pick = select(table.c.id).where(one_of(conn, table.c.id, ids)).order_by(table.c.id)
        conn.execute(pick.with_for_update())


def one_of(conn: Connection, column: Column[Any], ids: Sequence[int]) -> ColumnElement[bool]:
    """`column IN ids`. On PostgreSQL one array parameter (`= ANY(:ids)`): the statement text
    stays the same whatever the batch size, so it is parsed and planned once."""
    if conn.dialect.name == "postgresql":
        return column == any_(bindparam(None, list(ids), type_=_big_ints()))
    return column.in_(list(ids))


def pairs_in(
    conn: Connection, first: Column[Any], second: Column[Any], pairs: Sequence[tuple[int, int]]
) -> ColumnElement[bool]:
    """`(first, second) IN pairs`, with the same one-plan form on PostgreSQL (unnest)."""
    if conn.dialect.name == "postgresql":
        arrays = [bindparam(None, [p[i] for p in pairs], type_=_big_ints()) for i in (0, 1)]
        table = func.unnest(*arrays).table_valued("a", "b").render_derived("u")
        return tuple_(first, second).in_(select(table.c.a, table.c.b))
    return tuple_(first, second).in_(list(pairs))


def json_has(
    conn: Connection, column: Column[Any], pairs: Mapping[str, str] | BindParameter[Any]
) -> ColumnElement[bool]:
    """Whether a JSON object column holds each key of `pairs` with its value: JSONB
    containment (@>) on PostgreSQL, which a GIN index serves; json_extract on SQLite.
    On PostgreSQL `pairs` may be a parameter of the statement (the API's reads name it)."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import JSONB

        if isinstance(pairs, BindParameter):
            return column.op("@>")(pairs)
        return column.op("@>")(bindparam(None, dict(pairs), type_=JSONB))
    assert not isinstance(pairs, BindParameter)
    return and_(*(json_text(conn, column, k) == v for k, v in pairs.items()))


def json_text(conn: Connection, column: Column[Any], *path: str) -> ColumnElement[Any]:
    """The text at `path` in a JSON column (NULL where there is none, or it is no
    object): JSONB's path operator on PostgreSQL, json_extract on SQLite."""
    if conn.dialect.name == "postgresql":
        return func.jsonb_extract_path_text(column, *path)
    return func.json_extract(column, "$." + ".".join(f'"{p}"' for p in path))


def bucket_of(
    conn: Connection, column: Column[Any], start: datetime, width: timedelta
) -> ColumnElement[int]:
    """Which `width`-long bucket since `start` a datetime column's value falls in (0 the
    first; for values at or after `start`, both whole seconds): epoch arithmetic on
    PostgreSQL; on SQLite, which stores the text of naive UTC, its whole seconds
    (strftime's %s), in integers so that a bucket's edge falls exactly where it is."""
    seconds = int(width.total_seconds())
    if conn.dialect.name == "postgresql":
        since = bindparam(None, start, type_=column.type)
        # date_part is double precision; EXTRACT's numeric costs several times more a row.
        epoch = func.date_part("epoch", column - since)
        return func.floor(epoch / seconds).cast(Integer)
    elapsed = func.strftime("%s", column).cast(Integer) - int(start.timestamp())
    return elapsed // seconds


def _big_ints() -> Any:
    from sqlalchemy.dialects import postgresql  # imported on PostgreSQL only: a large package

    return postgresql.ARRAY(BigInteger())


def _insert(conn: Connection) -> Any:
    """The dialect's own INSERT (it takes ON CONFLICT); its package imported when used."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects import postgresql

        return postgresql.insert
    from sqlalchemy.dialects import sqlite

    return sqlite.insert


def upsert(conn: Connection, table: Table) -> Any:
    """An INSERT that takes ON CONFLICT ... DO UPDATE, on either database."""
    return _insert(conn)(table)


def insert_ignore_conflict(
    conn: Connection, table: Table, columns: Sequence[str], where: Any = None
) -> Any:
    """INSERT ... ON CONFLICT (columns) [WHERE where] DO NOTHING on either database; `where`
    names a partial unique index's condition."""
    return _insert(conn)(table).on_conflict_do_nothing(
        index_elements=list(columns), index_where=where
    )


class Explain(Executable, ClauseElement):
    """EXPLAIN (PostgreSQL) or EXPLAIN QUERY PLAN (SQLite) of a statement, without running it."""

    inherit_cache = False

    def __init__(self, statement: Any) -> None:
        self.statement = statement


@compiles(Explain)
def _compile_explain(element: Explain, compiler: Any, **kw: object) -> str:
    """SQLAlchemy's compiler hook: the options it passes (`kw`) go on to the statement's
    own compilation as they came."""
    prefix = "EXPLAIN QUERY PLAN " if compiler.dialect.name == "sqlite" else "EXPLAIN "
    return prefix + str(compiler.process(element.statement, **kw))


# --- bulk inserts --------------------------------------------------------------------------------

SQLITE_MAX_VARIABLES = 32_766


def insert_many(
    conn: Connection,
    table: Table,
    rows: Sequence[Mapping[str, Any]],
    returning: Sequence[str] = (),
    *,
    on_conflict: str = "",
) -> list[tuple[Any, ...]]:
    """INSERT many rows as one statement per database round trip; returns `returning` columns.

    The hot path (claims, events) writes hundreds of rows a batch. SQLAlchemy's generic
    executemany costs about 50 microseconds a row in Python; this builds one multi-row
    VALUES statement (SQLite), or on PostgreSQL uses COPY (no RETURNING) or one
    INSERT ... SELECT FROM unnest(arrays) (a fixed statement text the server plans once),
    converting values exactly as the table's types store them. Rows must all have the
    same keys. `on_conflict` is an ON CONFLICT clause, e.g. "ON CONFLICT (a, b) DO NOTHING"
    (then only the rows inserted are returned).
    """
    if not rows:
        return []
    cols = list(rows[0])
    values = [tuple(row[c] for c in cols) for row in rows]
    for i, c in enumerate(cols):  # only JSON and time columns need converting
        if (convert := _converter(conn, table.c[c].type)) is not None:
            memo: dict[Any, Any] = {}  # a batch repeats the same `now` and `{}` many times
            values = [(*v[:i], _memo_call(memo, convert, v[i]), *v[i + 1 :]) for v in values]
    tail = f" {on_conflict}" if on_conflict else ""
    tail += f" RETURNING {', '.join(returning)}" if returning else ""
    if conn.dialect.name == "postgresql" and not tail:
        _pg_copy(conn, table, cols, values)
        return []
    if conn.dialect.name == "postgresql":
        return _pg_insert_unnest(conn, table, cols, values, tail)
    return _sqlite_insert_values(conn, table, cols, values, tail, returning=bool(returning))


def _sqlite_insert_values(
    conn: Connection,
    table: Table,
    cols: list[str],
    values: list[tuple[Any, ...]],
    tail: str,
    *,
    returning: bool,
) -> list[tuple[Any, ...]]:
    """SQLite's insert_many: multi-row VALUES statements, as many rows each as its limit on
    a statement's parameters allows."""
    out: list[tuple[Any, ...]] = []
    per_chunk = max(1, SQLITE_MAX_VARIABLES // len(cols))
    for start in range(0, len(values), per_chunk):
        chunk = values[start : start + per_chunk]
        marks = ", ".join([f"({', '.join('?' * len(cols))})"] * len(chunk))
        sql = f"INSERT INTO {table.name} ({', '.join(cols)}) VALUES {marks}{tail}"
        result = conn.exec_driver_sql(sql, tuple(v for row in chunk for v in row))
        out += [tuple(r) for r in result] if returning else []
    return out


def _pg_insert_unnest(
    conn: Connection, table: Table, cols: list[str], values: list[tuple[Any, ...]], tail: str
) -> list[tuple[Any, ...]]:
    arrays = ", ".join(f"%s::{_pg_array_type(table.c[c].type)}[]" for c in cols)
    picks = ", ".join(f"u.{c}::jsonb" if is_json(table.c[c].type) else f"u.{c}" for c in cols)
    sql = (
        f"INSERT INTO {table.name} ({', '.join(cols)}) SELECT {picks}"
        f" FROM unnest({arrays}) AS u({', '.join(cols)}){tail}"
    )
    result = conn.exec_driver_sql(sql, tuple(list(column) for column in zip(*values, strict=True)))
    return [tuple(r) for r in result] if "RETURNING" in tail else []


def _pg_copy(
    conn: Connection, table: Table, cols: Sequence[str], values: Sequence[tuple[Any, ...]]
) -> None:
    """COPY rows in, inside the connection's open transaction (half the cost of INSERT)."""
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        with cursor.copy(f"COPY {table.name} ({', '.join(cols)}) FROM STDIN") as copy:
            for row in values:
                copy.write_row(row)
    finally:
        cursor.close()


def _pg_array_type(type_: Any) -> str:
    if isinstance(type_, Integer):
        return "bigint"
    if isinstance(type_, Float):
        return "double precision"
    if isinstance(type_, Boolean):
        return "boolean"
    if isinstance(type_, DateTime) or isinstance(getattr(type_, "impl", None), DateTime):
        return "timestamptz"
    return "text"  # strings, and JSON as text cast to jsonb


def _memo_call(memo: dict[Any, Any], convert: Callable[[Any], Any], value: Any) -> Any:
    key = (
        value
        if isinstance(value, datetime | str | int | None)
        else json.dumps(value, sort_keys=True)
    )
    if key not in memo:
        memo[key] = convert(value)
    return memo[key]


def is_json(type_: Any) -> bool:
    """Whether a column of this type holds JSON (tables.Json decorates JSON)."""
    return isinstance(type_, JSON) or isinstance(getattr(type_, "impl", None), JSON)


def _converter(conn: Connection, type_: Any) -> Callable[[Any], Any] | None:
    if is_json(type_):
        return json.dumps
    if isinstance(getattr(type_, "impl", None), DateTime):
        return sqlite_time if conn.dialect.name == "sqlite" else _utc
    return None


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    if value.tzinfo is None:
        raise ValueError("corral stores only timezone-aware datetimes")
    return value.astimezone(UTC)


def sqlite_time(value: datetime | None) -> str | None:
    """The text form SQLAlchemy's SQLite DateTime writes and reads back: naive UTC, microseconds."""
    utc = _utc(value)
    return None if utc is None else utc.replace(tzinfo=None).isoformat(" ", "microseconds")


TASKS = "corral_tasks"
"""PostgreSQL's LISTEN/NOTIFY channel of Python tasks' jobs: told when some become queued
(a submit, a hand-back, a release, a worker that reads parked ones registering), so that
waiting `corral worker` processes claim at once instead of at their next poll."""


def json_list_empty_or_has(conn: Connection, column: Any, value: Any) -> ColumnElement[bool]:
    """Whether the JSON array `column` is empty or holds `value` (a SQL expression): a
    worker's queues, empty for every queue, and a job's queue."""
    if conn.dialect.name == "postgresql":
        return or_(
            func.jsonb_array_length(column) == 0,
            column.op("@>")(func.jsonb_build_array(value)),
        )
    each = func.json_each(column).table_valued("value")
    return or_(
        func.json_array_length(column) == 0,
        exists(select(each.c.value).where(each.c.value == value)),
    )


def notify(conn: Connection, channel: str, payload: str = "") -> None:
    """PostgreSQL: NOTIFY `channel` when this transaction commits (listeners wake at once).
    SQLite has no such thing: its readers poll."""
    if conn.dialect.name == "postgresql":
        conn.execute(select(func.pg_notify(channel, payload)))
