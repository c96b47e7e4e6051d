"""FencedTable on a real SQLite file and the real PostgreSQL server: a stale attempt's
rows never overwrite a newer attempt's, whatever the interleaving."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral import errors
from corral.errors import StaleFenceError
from corral.sinks import FencedTable, add_fence_columns, fence_columns
from tests.support.wait import PATIENCE, eventually_sync

KEYS = [f"k{i}" for i in range(6)]
ROOT = Path(__file__).resolve().parents[2]


def make_table(url: str, name: str = "totals") -> sa.Engine:
    engine = sa.create_engine(url)
    meta = sa.MetaData()
    table = sa.Table(
        name,
        meta,
        sa.Column("day", sa.Text, primary_key=True),
        sa.Column("total", sa.Integer, nullable=False),
        *fence_columns(),
    )
    with engine.begin() as conn:
        conn.execute(sa.text(f"DROP TABLE IF EXISTS {name}"))
    meta.create_all(engine, tables=[table])
    return engine


@pytest.fixture
def engine(user_db_url: str) -> Iterator[sa.Engine]:
    e = make_table(user_db_url)
    yield e
    e.dispose()


def visible(engine: sa.Engine) -> dict[str, tuple[int, int]]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT day, total, fence FROM totals")).all()
    return {day: (total, fence) for day, total, fence in rows}


def test_newer_or_equal_fences_apply_older_ones_are_refused(engine: sa.Engine) -> None:
    t = FencedTable(engine, "totals", key=["day"])
    assert t.upsert([{"day": "a", "total": 1}, {"day": "b", "total": 1}], fence=7).applied == 2
    r8 = t.upsert([{"day": "a", "total": 2}], fence=8, code_version="v2")
    assert (r8.applied, r8.refused) == (1, 0)
    r7 = t.upsert([{"day": "a", "total": 9}, {"day": "b", "total": 9}], fence=7)
    assert (r7.applied, r7.refused) == (1, 1), "b is still 7's; a is 8's"
    again = t.upsert([{"day": "a", "total": 3}], fence=8, code_version="v2")
    assert (again.applied, again.refused) == (1, 0), "the same attempt writing again applies"
    assert visible(engine) == {"a": (3, 8), "b": (9, 7)}
    with engine.connect() as conn:
        versions = dict(conn.execute(sa.text("SELECT day, code_version FROM totals")).all())
    assert versions == {"a": "v2", "b": None}, "each write stamps its own code version"


def test_strict_writes_nothing_and_names_both_fences(engine: sa.Engine) -> None:
    t = FencedTable(engine, "totals", key=["day"])
    t.upsert([{"day": "a", "total": 1}], fence=8)
    with pytest.raises(StaleFenceError) as caught:
        t.upsert([{"day": "a", "total": 2}, {"day": "new", "total": 2}], fence=7, strict=True)
    assert (caught.value.fence, caught.value.newer) == (7, 8)
    assert "fence 8, newer than this attempt's 7" in str(caught.value)
    assert visible(engine) == {"a": (1, 8)}, "not even the new row"


def test_the_fence_comes_from_the_attempts_environment(
    engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in (("CORRAL_JOB_ID", "3"), ("CORRAL_ATTEMPT", "2"), ("CORRAL_FENCE", "11")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("CORRAL_CODE_VERSION", "git-abc123")
    FencedTable(engine, "totals", key=["day"]).upsert([{"day": "a", "total": 1}])
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT fence, code_version FROM totals")).one() == (
            11,
            "git-abc123",
        )


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"day": "a", "total": 1, "colour": "red"}], "no column colour"),
        ([{"total": 1}], "no key column day"),
        ([{"day": "a", "total": 1}, {"day": "a", "total": 2}], "twice in one upsert"),
        ([{"day": "a", "total": 1, "fence": 99}], "set by the sink"),
        ([{"day": "a", "total": 1}, {"day": "b"}], "the same columns"),
    ],
)
def test_bad_rows_are_refused_before_anything_is_written(
    engine: sa.Engine, rows: list[dict[str, object]], message: str
) -> None:
    with pytest.raises(errors.InvalidInput, match=message):
        FencedTable(engine, "totals", key=["day"]).upsert(rows, fence=1)
    assert visible(engine) == {}


def test_a_table_without_fence_columns_gets_them(user_db_url: str) -> None:
    engine = sa.create_engine(user_db_url)
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE IF EXISTS plain"))
        conn.execute(sa.text("CREATE TABLE plain (day TEXT PRIMARY KEY, total INTEGER)"))
        conn.execute(sa.text("INSERT INTO plain VALUES ('old', 5)"))
    with pytest.raises(errors.ConfigError, match="add_fence_columns"):
        FencedTable(engine, "plain", key=["day"])
    add_fence_columns(engine, "plain")
    add_fence_columns(engine, "plain")  # twice is fine
    t = FencedTable(engine, "plain", key=["day"])
    assert t.upsert([{"day": "old", "total": 6}], fence=1).applied == 1, "old rows hold fence 0"
    engine.dispose()


# --- any interleaving --------------------------------------------------------------------


@st.composite
def interleavings(draw: st.DrawFn) -> list[tuple[int, list[str]]]:
    """N attempts (fences 1..N), each writing every key in chunks; the chunks of all
    attempts interleaved at random (each attempt's own chunks stay in order)."""
    n = draw(st.integers(1, 4))
    queues = []
    for fence in range(1, n + 1):
        order = draw(st.permutations(KEYS))
        cuts = sorted(draw(st.sets(st.integers(1, len(KEYS) - 1), max_size=3)))
        chunks = [order[a:b] for a, b in zip([0, *cuts], [*cuts, len(KEYS)], strict=True)]
        queues.append([(fence, list(c)) for c in chunks])
    steps = []
    while any(queues):
        live = [q for q in queues if q]
        steps.append(live[draw(st.integers(0, len(live) - 1))].pop(0))
    return steps


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=interleavings())
def test_any_interleaving_leaves_exactly_the_newest_attempts_output(
    engine: sa.Engine, steps: list[tuple[int, list[str]]]
) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM totals"))
    t = FencedTable(engine, "totals", key=["day"])
    applied = refused = 0
    for fence, keys in steps:
        r = t.upsert([{"day": k, "total": fence * 100} for k in keys], fence=fence)
        applied, refused = applied + r.applied, refused + r.refused
    newest = max(fence for fence, _ in steps)
    assert visible(engine) == {k: (newest * 100, newest) for k in KEYS}, "never a mix"
    assert applied + refused == sum(len(keys) for _, keys in steps)


# --- the torn partition, with real processes -----------------------------------------------


def writer(url: str, fence: int, gate: Path) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "CORRAL_JOB_ID": "1",
        "CORRAL_ATTEMPT": str(fence),
        "CORRAL_FENCE": str(fence),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.fenced_writer", url, ",".join(KEYS), str(gate)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_a_paused_attempt_cannot_tear_what_its_successor_wrote(
    engine: sa.Engine, user_db_url: str, tmp_path: Path
) -> None:
    # Attempt 7 writes half its rows and is paused (SIGSTOP): it looks dead. Attempt 8 is
    # launched, writes all of its rows. Attempt 7 resumes (SIGCONT) and writes the rest.
    gate7 = tmp_path / "gate7"
    seven = writer(user_db_url, 7, gate7)
    half = tmp_path / "gate7.half"
    eventually_sync(half.exists, what="attempt 7 wrote its first half")
    seven.send_signal(signal.SIGSTOP)
    gate7.touch()  # once it runs again, it goes on at once
    eight = writer(user_db_url, 8, tmp_path / "gate8")
    (tmp_path / "gate8").touch()
    out8, _ = eight.communicate(timeout=PATIENCE)
    seven.send_signal(signal.SIGCONT)
    out7, _ = seven.communicate(timeout=PATIENCE)
    assert eight.returncode == seven.returncode == 0
    assert visible(engine) == {k: (800, 8) for k in KEYS}, "entirely attempt 8's"
    assert out8.split() == ["applied=3", "refused=0", "applied=3", "refused=0"]
    assert out7.split()[2:] == ["applied=0", "refused=3"], "7's second half: refused"
