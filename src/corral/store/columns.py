"""The parts every table of the schema shares: one MetaData (with the names of its
constraints and indexes), the column types that read and write the same on both databases
(UTC datetimes, JSON, ids), and the columns many tables have (their own id, the tenant, the
times every row has), made by one function each so they are the same everywhere."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Column, DateTime, Dialect, Integer, MetaData, String
from sqlalchemy.types import TypeDecorator, TypeEngine

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on both databases (SQLite stores naive UTC text)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("corral stores only timezone-aware datetimes")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class _Json(TypeDecorator[Any]):
    """JSON; JSONB on PostgreSQL, whose dialect is imported only there (a large package: a
    command on SQLite does not pay for it)."""

    impl = JSON
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import JSONB

            return dialect.type_descriptor(JSONB())
        return dialect.type_descriptor(JSON())


Json: Any = _Json()
# SQLite makes only an INTEGER PRIMARY KEY the rowid alias that autoincrements.
Id: Any = BigInteger().with_variant(Integer(), "sqlite")


def id_column() -> Column[Any]:
    """A table's own id: a number that only grows (on SQLite, the rowid)."""
    return Column("id", Id, primary_key=True, autoincrement=True)


def tenant_column(*, nullable: bool = False) -> Column[Any]:
    """The tenant a row belongs to (nullable: None for every tenant, an operator's)."""
    return Column("tenant", String(200), nullable=nullable)


def at(name: str) -> Column[Any]:
    """A time that every row has."""
    return Column(name, UTCDateTime, nullable=False)


def made() -> tuple[Column[Any], Column[Any]]:
    """When a row was made and last changed."""
    return at("created_at"), at("updated_at")
