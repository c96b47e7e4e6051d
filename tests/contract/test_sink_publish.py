"""Publisher (write-audit-publish) with its pointer in corral's store, on both databases:
readers always see exactly one attempt's complete output."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from textwrap import dedent

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral import config, errors
from corral.errors import AuditFailed, StaleFenceError
from corral.sinks import (
    MinRows,
    Publisher,
    UniqueKeys,
    resolve,
    rows_of,
)
from corral.testing import FrozenClock
from tests.conftest import pg_empty
from tests.support.wait import PATIENCE, eventually_sync

ROOT = Path(__file__).resolve().parents[2]
ROWS = 6


def publisher(
    tmp: Path, url: str, fence: int, clk: FrozenClock | None = None, dataset: str = "sales/day"
) -> Publisher:
    return Publisher(
        dataset,
        root=tmp / "warehouse",
        fence=fence,
        code_version=f"v{fence}",
        settings=config.Settings(database_url=url),
        clk=clk,
    )


def output(fence: int) -> list[dict[str, int]]:
    return [{"id": i, "value": fence * 100 + i} for i in range(ROWS)]


def seen(url: str, dataset: str = "sales/day") -> list[dict[str, int]]:
    folder = resolve(dataset, settings=config.Settings(database_url=url))
    assert folder is not None
    return sorted(rows_of(folder), key=lambda r: r["id"])


def staged(tmp: Path, url: str, fence: int, clk: FrozenClock | None = None) -> Publisher:
    p = publisher(tmp, url, fence, clk)
    p.stage()
    p.write_rows("part-0.jsonl", output(fence))
    return p


def test_the_newest_publish_wins_in_either_order(tmp_path: Path, db_url: str) -> None:
    seven, eight = staged(tmp_path, db_url, 7), staged(tmp_path, db_url, 8)
    pointer = eight.publish(audits=[MinRows(ROWS)])
    assert (pointer.fence, pointer.code_version) == (8, "v8")
    with pytest.raises(StaleFenceError, match="fence 8 published it already") as caught:
        seven.publish()
    assert (caught.value.fence, caught.value.newer) == (7, 8)
    assert seen(db_url) == output(8)
    assert eight.publish().fence == 8, "publishing the same folder again is no conflict"


def test_a_published_folder_is_never_written_again(tmp_path: Path, db_url: str) -> None:
    eight = staged(tmp_path, db_url, 8)
    eight.publish()
    with pytest.raises(errors.InvalidInput, match="published already"):
        eight.write_rows("late.jsonl", output(8))
    with pytest.raises(errors.InvalidInput, match="needs a new attempt"):
        eight.stage()
    with pytest.raises(errors.InvalidInput, match="needs a new attempt"):
        publisher(tmp_path, db_url, 7).stage()
    assert seen(db_url) == output(8)


def test_a_failed_audit_publishes_nothing_and_says_why(tmp_path: Path, db_url: str) -> None:
    staged(tmp_path, db_url, 7).publish()
    bad = publisher(tmp_path, db_url, 8)
    bad.stage()
    bad.write_rows("part-0.jsonl", [*output(8)[:2], output(8)[0]])
    with pytest.raises(AuditFailed) as caught:
        bad.publish(audits=[MinRows(ROWS), UniqueKeys(["id"])])
    assert caught.value.problems == [
        f"3 rows, fewer than the {ROWS} required",
        "key {'id': 0} appears twice",
    ]
    assert seen(db_url) == output(7), "still the last good output"


def test_clean_removes_what_can_never_be_published_and_nothing_else(
    tmp_path: Path, db_url: str
) -> None:
    clk = FrozenClock()
    five, six, _seven = (staged(tmp_path, db_url, f, clk) for f in (5, 6, 7))
    assert six.clean() == [], "nothing published yet: every folder may be in use"
    six.publish()
    assert six.clean() == [], "nothing is older than the retention yet"
    clk.advance(timedelta(days=8).total_seconds() + time.time() - clk.now().timestamp())
    removed = six.clean()
    assert [r.rstrip("/").rsplit("/", 1)[1] for r in removed] == [five.staging.rsplit("/", 1)[1]]
    assert seen(db_url) == output(6), "the published folder stays; fence 7's too"


def test_any_fsspec_filesystem_holds_the_data(db_url: str) -> None:
    # An object store has no folders and no rename: staging and the pointer still work.
    for fence in (3, 4):
        p = Publisher(
            "sales/day",
            root=f"memory://wh-{abs(hash(db_url))}",
            fence=fence,
            settings=config.Settings(database_url=db_url),
        )
        p.stage()
        p.write_rows("part-0.jsonl", output(fence))
        p.publish(audits=[MinRows(ROWS), UniqueKeys(["id"])])
    location = resolve("sales/day", settings=config.Settings(database_url=db_url))
    assert location is not None
    assert location.startswith("memory://")
    assert "/sales/day/_staging/fence=4-" in location
    assert seen(db_url) == output(4)


def test_bad_dataset_names_are_refused(tmp_path: Path, db_url: str) -> None:
    for name in ("", "/abs", "a/../b"):
        with pytest.raises(errors.InvalidInput, match="dataset"):
            publisher(tmp_path, db_url, 1, dataset=name)


# --- any interleaving --------------------------------------------------------------------


@st.composite
def schedules(draw: st.DrawFn) -> list[tuple[int, str]]:
    """Up to 4 attempts, each: stage, write its rows in 1-3 parts, maybe publish; the
    steps of all attempts interleaved at random, each attempt's own in order."""
    queues = []
    for fence in range(1, draw(st.integers(1, 4)) + 1):
        parts = draw(st.integers(1, 3))
        steps = [(fence, "stage")] + [(fence, f"write {i} {parts}") for i in range(parts)]
        if draw(st.booleans()) or fence == 1:
            steps.append((fence, "publish"))
        queues.append(steps)
    out = []
    while any(queues):
        live = [q for q in queues if q]
        out.append(live[draw(st.integers(0, len(live) - 1))].pop(0))
    return out


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plan=schedules())
def test_any_interleaving_shows_one_attempts_whole_output(
    tmp_path_factory: pytest.TempPathFactory, db_url: str, plan: list[tuple[int, str]]
) -> None:
    tmp = tmp_path_factory.mktemp("wap")
    dataset = f"d{tmp.name}"
    attempts = {f: publisher(tmp, db_url, f, dataset=dataset) for f, _ in plan}
    blocked: set[int] = set()
    published, refused = [], 0
    for fence, step in plan:
        p = attempts[fence]
        if fence in blocked:
            refused += step == "publish"
        elif step == "stage":
            try:
                p.stage()
            except errors.InvalidInput:  # a newer attempt published before this one began
                blocked.add(fence)
        elif step.startswith("write"):
            _, part, parts = step.split()
            p.write_rows(f"part-{part}.jsonl", output(fence)[int(part) :: int(parts)])
        else:
            try:
                p.publish(audits=[MinRows(ROWS)])
                published.append(fence)
            except StaleFenceError:
                refused += 1
    publishers = [f for f, step in plan if step == "publish"]
    assert published == sorted(published), "each swap moved the pointer forward"
    assert len(published) + refused == len(publishers)
    assert seen(db_url, dataset) == output(max(publishers)), "never a mix"


# --- the torn partition, with real processes -----------------------------------------------


def attempt(url: str, fence: int, root: Path, gate: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "CORRAL_JOB_ID": "1", "CORRAL_ATTEMPT": str(fence)}
    env |= {"CORRAL_FENCE": str(fence), "CORRAL_DATABASE_URL": url}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.wap_writer", str(root), str(gate), str(ROWS)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_paused_attempt_cannot_tear_its_successors_partition(tmp_path: Path, db_url: str) -> None:
    root = tmp_path / "warehouse"
    gate7 = tmp_path / "gate7"
    seven = attempt(db_url, 7, root, gate7)
    eventually_sync(Path(f"{gate7}.half").exists, what="attempt 7 staged its first half")
    seven.send_signal(signal.SIGSTOP)  # it looks dead: attempt 8 is launched
    gate7.touch()
    (tmp_path / "gate8").touch()
    eight = attempt(db_url, 8, root, tmp_path / "gate8")
    out8, err8 = eight.communicate(timeout=PATIENCE)
    assert eight.returncode == 0, err8
    seven.send_signal(signal.SIGCONT)
    out7, err7 = seven.communicate(timeout=PATIENCE)
    assert out8.strip() == "published fence 8"
    assert out7.strip() == "refused: fence 8 holds it", err7
    assert seen(db_url, "sales/day") == output(8), "entirely attempt 8's"


RACE = dedent(
    """
    import sys, time
    from pathlib import Path
    from corral.errors import StaleFenceError
    from corral.sinks import Publisher
    root, gate, ready = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    pub = Publisher("sales/day", root=root)
    pub.stage()
    pub.write_rows("part-0.jsonl", [{"id": 0, "value": 1}])
    ready.touch()
    while not gate.exists():
        time.sleep(0.001)
    try:
        pub.publish()
        print("won")
    except StaleFenceError:
        print("lost")
    """
)


@pytest.mark.postgres
def test_two_processes_publishing_at_the_same_moment_one_swap_wins(
    tmp_path: Path, pg_url: str
) -> None:
    pg_empty(pg_url)
    gate = tmp_path / "go"
    env = {**os.environ, "CORRAL_JOB_ID": "1", "CORRAL_ATTEMPT": "9", "CORRAL_FENCE": "9"}
    env["CORRAL_DATABASE_URL"] = pg_url
    ready = [tmp_path / f"ready{i}" for i in range(2)]
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACE, str(tmp_path / f"root{i}"), str(gate), str(ready[i])],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    eventually_sync(lambda: all(r.exists() for r in ready), what="both staged, at the gate")
    gate.touch()
    outcomes = sorted(p.communicate(timeout=PATIENCE)[0].strip() for p in racers)
    assert outcomes == ["lost", "won"], "the same fence twice: exactly one swap"
