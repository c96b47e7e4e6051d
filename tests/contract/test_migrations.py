"""Migrations are history: a landed migration never changes, and a database migrated by
an earlier text of one is brought up to the schema all the same."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text

from corral.store import migrate
from corral.store.indexes import compared_on
from corral.store.indexes import metadata as schema
from tests.conftest import pg_database

VERSIONS = migrate.MIGRATIONS / "versions"
LANDED = Path(__file__).with_name("migrations.sha256")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database with nothing in it, on each backend (never the session's shared one)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    with pg_database("corral_m") as url:
        yield url


def test_a_database_from_the_first_text_of_0003_is_repaired(empty_url: str) -> None:
    engine = create_engine(empty_url)
    with engine.begin() as conn:
        migrate.upgrade(conn, "0003")
        # What the first text of 0003 made: the checkpoints table only.
        conn.execute(text("DROP TABLE publish_pointers"))
        conn.execute(text("ALTER TABLE jobs DROP COLUMN code_version"))
    with engine.begin() as conn:
        migrate.upgrade(conn)
    with engine.connect() as conn:
        assert migrate.current(conn) == migrate.head()
        assert "publish_pointers" in inspect(conn).get_table_names()
        diff = compare_metadata(
            MigrationContext.configure(
                conn, opts={"compare_type": True, "include_object": compared_on(conn.dialect.name)}
            ),
            schema,
        )
    engine.dispose()
    assert diff == []


def test_upgrading_a_database_that_is_up_to_date_changes_nothing(empty_url: str) -> None:
    engine = create_engine(empty_url)
    with engine.begin() as conn:
        migrate.upgrade(conn)
    with engine.begin() as conn:
        migrate.upgrade(conn)
        assert migrate.current(conn) == migrate.head()
    engine.dispose()


def digests() -> dict[str, str]:
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(VERSIONS.glob("*.py"))
    }


def test_landed_migrations_never_change() -> None:
    """A migration that has landed is history: a database migrated by its first text would
    pass the schema check and then fail on what a later text added. Change the schema in a
    new migration instead. A new migration adds its line to tests/contract/migrations.sha256
    in the commit that adds it (`sha256sum src/corral/store/migrations/versions/NNNN_*.py`)."""
    landed = dict(
        reversed(line.split()) for line in LANDED.read_text().splitlines() if line.strip()
    )
    found = digests()
    changed = sorted(
        name for name, digest in landed.items() if found.get(Path(name).name) != digest
    )
    assert not changed, f"landed migrations changed or removed: {changed}; add a new one instead"
    new = sorted(set(found) - {Path(name).name for name in landed})
    assert not new, f"migrations without a recorded digest: {new}; record them in {LANDED.name}"


def _migrated_to(url: str, revision: str) -> None:
    """The database at `url` as a corral of `revision` left it."""
    engine = create_engine(url)
    with engine.begin() as conn:
        migrate.upgrade(conn, revision)
    engine.dispose()


LATER_JOB_COLUMNS = {
    "tenant_made": "BOOLEAN NOT NULL DEFAULT false",
    "callback": "TEXT",
    "failure_callback": "TEXT",
    "callback_of": "BIGINT",
    "flow": "VARCHAR(100)",
}
"""Columns of `jobs` that later revisions add and today's claim reads."""


LATER_SHARES = (
    "CREATE TABLE tenant_shares (tenant VARCHAR(200) PRIMARY KEY, turn FLOAT NOT NULL,"
    " clock FLOAT NOT NULL)"
)
"""The table of fair shares (0026), which today's claim reads."""


@contextlib.contextmanager
def _lent_job_columns(url: str) -> Iterator[None]:
    """Today's claim, on a database of an old revision: the job columns and the table of
    fair shares later revisions add are lent for it and taken back, so the old revision is
    what the upgrade then finds."""
    engine = create_engine(url)
    with engine.begin() as conn:
        for name, kind in LATER_JOB_COLUMNS.items():
            conn.execute(text(f"ALTER TABLE jobs ADD COLUMN {name} {kind}"))
        conn.execute(text(LATER_SHARES))
    try:
        yield
    finally:
        with engine.begin() as conn:
            for name in LATER_JOB_COLUMNS:
                conn.execute(text(f"ALTER TABLE jobs DROP COLUMN {name}"))
            conn.execute(text("DROP TABLE tenant_shares"))
        engine.dispose()


def _valid_indexes(url: str, *names: str) -> set[str]:
    """The indexes of these tables; on PostgreSQL, having checked that none is invalid (what a
    concurrent build that failed half way leaves)."""
    engine = create_engine(url)
    with engine.connect() as conn:
        found = {i["name"] for t in names for i in inspect(conn).get_indexes(t)}
        if conn.dialect.name == "postgresql":
            invalid = conn.execute(text("SELECT count(*) FROM pg_index WHERE NOT indisvalid"))
            assert invalid.scalar() == 0
    engine.dispose()
    return {name for name in found if name}


async def test_0006_moves_a_database_with_jobs_to_the_new_indexes(empty_url: str) -> None:
    """What `corral db upgrade` does to a database of 0005 that holds jobs: nothing lost, the
    new indexes valid (on PostgreSQL built concurrently), the keys still unique."""
    from corral import model, store
    from corral.testing import FrozenClock

    _migrated_to(empty_url, "0005")
    old = store.Store.connect(empty_url)
    clock = FrozenClock()
    keyed = [model.NewJob(executor="noop", spec={}, idempotency_key=f"k{i}") for i in range(50)]
    plain = [model.NewJob(executor="noop", spec={}) for _ in range(50)]
    made = await old.jobs.submit(new=keyed + plain, now=clock.now())
    with _lent_job_columns(empty_url):
        await old.jobs.claim(now=clock.now(), limit=10, executors=["noop"])
    await old.close()

    db = store.Store.connect(empty_url)
    before, after = await db.database.migrate()
    assert (before, after) == ("0005", migrate.head())
    counts = await db.jobs.count_by_state()
    assert counts == {"queued": 90, "running": 10}
    again = await db.jobs.submit(new=keyed[:3], now=clock.now())
    assert again == [(job_id, False) for job_id, _ in made[:3]]
    assert len(await db.jobs.claim(now=clock.now(), limit=100, executors=["noop"])) == 90
    await db.close()
    indexes = _valid_indexes(empty_url, "jobs", "attempts")
    assert {"ix_jobs_queued_tenant", "ix_jobs_pooled", "uq_jobs_idempotency"} <= indexes
    assert "ix_jobs_claim" not in indexes
    engine = create_engine(empty_url)
    with engine.connect() as conn:
        diff = compare_metadata(
            MigrationContext.configure(
                conn, opts={"compare_type": True, "include_object": compared_on(conn.dialect.name)}
            ),
            schema,
        )
    engine.dispose()
    assert diff == []


async def test_0007_indexes_live_attempts_only(empty_url: str) -> None:
    """A database of 0006 with attempts live and ended: after `corral db upgrade` the live
    ones are found where they were (the dispatcher's poll, by executor, in fence order)
    through ix_attempts_live, which holds them and only them."""
    from corral import model, store
    from corral.testing import FrozenClock

    _migrated_to(empty_url, "0006")
    old = store.Store.connect(empty_url)
    clock = FrozenClock()
    await old.jobs.submit(
        new=[model.NewJob(executor="noop", spec={}) for _ in range(6)], now=clock.now()
    )
    with _lent_job_columns(empty_url):
        claimed = await old.jobs.claim(now=clock.now(), limit=6, executors=["noop"])
        # Failures: today's settle of a success also keeps its run log, a table 0006 lacks.
        ended = [
            store.Finish(c.attempt.id, model.AttemptState.FAILED, 1, None) for c in claimed[:2]
        ]
        await old.attempts.settle(
            launched=[c.attempt.id for c in claimed[2:4]], finishes=ended, now=clock.now()
        )
    await old.close()

    db = store.Store.connect(empty_url)
    assert await db.database.migrate() == ("0006", migrate.head())
    live = await db.attempts.list_active(executor="noop", limit=10)
    assert [a.id for a in live] == [c.attempt.id for c in claimed[2:]]
    await db.close()
    indexes = _valid_indexes(empty_url, "attempts")
    assert "ix_attempts_live" in indexes
    assert "ix_attempts_active" not in indexes


@pytest.mark.postgres
async def test_0007_builds_again_an_index_a_failed_build_left_invalid() -> None:
    """A concurrent build that failed half way leaves an invalid index of that name behind;
    upgrading again drops it and builds it anew, valid."""
    from corral import store

    with pg_database("corral_m") as url:
        engine = create_engine(url)
        with engine.begin() as conn:
            migrate.upgrade(conn, "0006")
            conn.execute(text("CREATE INDEX ix_attempts_live ON attempts (id)"))  # half-built
            conn.execute(
                text(
                    "UPDATE pg_index SET indisvalid = false"
                    " WHERE indexrelid = 'ix_attempts_live'::regclass"
                )
            )
        db = store.Store.connect(url)
        assert await db.database.migrate() == ("0006", migrate.head())
        await db.close()
        with engine.connect() as conn:
            valid = conn.execute(
                text(
                    "SELECT i.indisvalid, pg_get_indexdef(i.indexrelid) FROM pg_index i"
                    " WHERE i.indexrelid = 'ix_attempts_live'::regclass"
                )
            ).one()
        engine.dispose()
    assert valid[0] is True
    assert "(id) WHERE" in valid[1]


def test_the_schema_check_reads_the_revisions_as_alembic_does(empty_url: str) -> None:
    """Every command checks the schema without importing Alembic: the revisions it reads
    from the migration files, and the one it reads from the database, are Alembic's."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(migrate.alembic_config())
    assert migrate.head() == script.get_current_head()
    assert all(migrate.known(r.revision) for r in script.walk_revisions())
    assert len(list(script.walk_revisions())) == len(list(VERSIONS.glob("*.py")))
    assert not any(migrate.known(r) for r in ("0000", "9999"))
    engine = create_engine(empty_url)
    with engine.connect() as conn:
        assert migrate.current(conn) is None
    for revision in ("0002", "head"):
        with engine.begin() as conn:
            migrate.upgrade(conn, revision)
        with engine.connect() as conn:
            assert migrate.current(conn) == MigrationContext.configure(conn).get_current_revision()
    engine.dispose()


async def test_0012_keeps_where_each_rule_and_subject_stands(empty_url: str) -> None:
    """A database of 0011 with messages sent: after the upgrade each rule and subject's
    window and owed recovery are read off its newest messages; a late firing owes none."""
    from datetime import timedelta

    from sqlalchemy import insert

    from corral import store
    from corral.store.tables import alert_streaks, alerts
    from corral.testing import FrozenClock

    _migrated_to(empty_url, "0011")
    clock = FrozenClock()
    t0 = clock.now()

    def message(n: int, rule: str, about: str, kind: str, cause: str) -> dict[str, object]:
        return {
            "dedupe_key": f"k{n}",
            "rule": rule,
            "channel": "hook",
            "kind": kind,
            "cause": cause,
            "subject": about,
            "job_id": n,
            "details": {},
            "state": "delivered",
            "created_at": t0 + timedelta(minutes=n),
            "due_at": t0,
            "tries": 1,
        }

    rows = [
        message(1, "poison", "queue:billing", "alert", "quarantined"),  # recovered since
        message(2, "poison", "queue:billing", "recovered", "succeeded"),
        message(3, "poison", "queue:mail", "recovered", "succeeded"),  # failed again since
        message(4, "poison", "queue:mail", "alert", "failed"),
        message(5, "late", "schedule:default/nightly", "alert", "schedule_late"),
    ]
    engine = create_engine(empty_url)
    with engine.begin() as conn:
        conn.execute(insert(alerts), rows)
        conn.execute(insert(alert_streaks).values(rule="poison", subject="queue:mail", failures=2))
    engine.dispose()
    db = store.Store.connect(empty_url)
    assert await db.database.migrate() == ("0011", migrate.head())
    pairs = [
        ("poison", "queue:billing"),
        ("poison", "queue:mail"),
        ("late", "schedule:default/nightly"),
    ]
    assert await db.alerts.sent(pairs=pairs) == {
        ("poison", "queue:billing"): (t0 + timedelta(minutes=1), False, 0),
        ("poison", "queue:mail"): (t0 + timedelta(minutes=4), True, 2),
        ("late", "schedule:default/nightly"): (t0 + timedelta(minutes=5), False, 0),
    }
    # Kept as it stood, but no longer open: alerts are about a schedule, a key or a job
    # now, and no success is ever about a queue again, so none would close it.
    assert await db.alerts.open() == set()
    await db.close()


async def test_0023_gives_each_pointer_the_tenant_of_its_fence_s_job(empty_url: str) -> None:
    """A database of 0022 with pointers: after the upgrade, a pointer whose attempt is
    still stored takes its job's tenant, one whose attempt is gone takes `default`, and
    two tenants may then each hold a dataset of one name."""
    from datetime import UTC, datetime

    from sqlalchemy import insert

    from corral import store
    from corral.store.tables import attempts, jobs

    _migrated_to(empty_url, "0022")
    t0 = datetime(2026, 12, 1, tzinfo=UTC)
    engine = create_engine(empty_url)
    with engine.begin() as conn:
        conn.execute(
            insert(jobs).values(
                id=7,
                tenant="acme",
                queue="q",
                executor="noop",
                spec={},
                state="succeeded",
                priority=0,
                run_at=t0,
                max_attempts=1,
                attempt_count=1,
                labels={},
                created_at=t0,
                updated_at=t0,
            )
        )
        conn.execute(
            insert(attempts).values(
                id=70,
                job_id=7,
                attempt_no=1,
                launch_name="j7-1",
                executor="noop",
                state="succeeded",
                created_at=t0,
                updated_at=t0,
            )
        )
        for dataset, fence in (("sales", 70), ("old", 3)):
            conn.execute(
                text(
                    "INSERT INTO publish_pointers (dataset, fence, location, published_at)"
                    " VALUES (:d, :f, :l, :t)"
                ),
                {"d": dataset, "f": fence, "l": f"file:///{dataset}", "t": t0},
            )
    engine.dispose()
    db = store.Store.connect(empty_url)
    assert await db.database.migrate() == ("0022", migrate.head())
    sales = await db.sinks.pointer_get(dataset="sales", tenant="acme")
    assert sales is not None
    assert (sales.tenant, sales.fence) == ("acme", 70)
    assert await db.sinks.pointer_get(dataset="sales", tenant="default") is None
    old = await db.sinks.pointer_get(dataset="old", tenant="default")
    assert old is not None
    assert old.location == "file:///old"
    assert await db.sinks.pointer_get(dataset="sales", fence=70) == sales
    await db.close()


async def test_a_sqlite_file_corral_makes_is_readable_by_its_owner_alone(tmp_path: Path) -> None:
    """It holds every tenant's payloads and secrets: made 0600, as are SQLite's -wal and
    -shm beside it. A file that was there already keeps its mode (`corral check` warns)."""
    import stat

    from corral import store

    made = tmp_path / "new.db"
    db = store.Store.connect(f"sqlite:///{made}")
    await db.database.migrate()
    beside = sorted(tmp_path.glob("new.db*"))
    assert [p.name for p in beside] == ["new.db", "new.db-shm", "new.db-wal"]
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in beside} == dict.fromkeys(
        ["new.db", "new.db-shm", "new.db-wal"], 0o600
    )
    await db.close()
    theirs = tmp_path / "theirs.db"
    theirs.touch()
    theirs.chmod(0o644)
    db = store.Store.connect(f"sqlite:///{theirs}")
    await db.database.migrate()
    await db.close()
    assert stat.S_IMODE(theirs.stat().st_mode) == 0o644


async def test_0027_gives_each_run_log_its_job_s_tenant_and_its_size(empty_url: str) -> None:
    """A database of 0026 with run logs: after the upgrade each counts toward its job's
    tenant, its size the UTF-8 bytes of its streams' text as a log written now counts it."""
    from datetime import UTC, datetime

    from sqlalchemy import insert

    from corral import store
    from corral.store import runlogs
    from corral.store.tables import jobs

    _migrated_to(empty_url, "0026")
    t0 = datetime(2026, 12, 1, tzinfo=UTC)
    streams = {
        1: [{"name": "stdout", "text": "héllo\n", "bytes": 7, "cut": False}],
        2: [
            {"name": "request", "text": "GET /", "bytes": 5, "cut": False},
            {"name": "response", "text": "HTTP 200 ✓", "bytes": 12, "cut": True},
        ],
        3: [],
    }
    job = {"queue": "q", "executor": "noop", "spec": {}, "state": "succeeded", "priority": 0}
    engine = create_engine(empty_url)
    with engine.begin() as conn:
        for job_id, tenant in ((1, "a"), (2, "b"), (3, "b")):
            conn.execute(
                insert(jobs).values(
                    id=job_id, tenant=tenant, run_at=t0, max_attempts=1, attempt_count=1,
                    labels={}, created_at=t0, updated_at=t0, **job,
                )
            )  # fmt: skip
        for job_id, kept in streams.items():
            conn.execute(
                text(
                    "INSERT INTO run_logs (attempt_id, job_id, recorded_at, streams)"
                    " VALUES (:a, :j, :t, :s)"
                ),
                {"a": 10 + job_id, "j": job_id, "t": t0, "s": json.dumps(kept)},
            )
    engine.dispose()
    db = store.Store.connect(empty_url)
    assert await db.database.migrate() == ("0026", migrate.head())
    sizes = {job_id: runlogs.size(kept) for job_id, kept in streams.items()}
    assert sizes == {1: 7, 2: 5 + 12, 3: 0}
    assert await db.runlogs.kept() == {"a": 7, "b": 17}
    [log] = (await db.runlogs.of_job(job_id=2)).values()
    assert (log.trimmed_at, [s.text for s in log.streams]) == (None, ["GET /", "HTTP 200 ✓"])
    await db.close()
