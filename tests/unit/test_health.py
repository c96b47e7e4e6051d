"""The health file: written once every loop has done a round, at most once a second, never
in a loop's way; read by `corral health`, which names the loop that stopped."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import timedelta
from pathlib import Path

import pytest

from corral import errors, health
from corral.testing import FrozenClock
from tests.support.wait import PATIENCE

BOTH = [health.DISPATCHER, health.RECONCILER]


async def settled(beats: health.HealthFile) -> None:
    """Let a write in flight finish (it runs in a worker thread)."""
    if beats._writing is not None:
        await asyncio.wait_for(asyncio.shield(beats._writing), PATIENCE)


def loops_in(path: Path) -> dict[str, str]:
    loops: dict[str, str] = json.loads(path.read_text())["loops"]
    return loops


async def test_the_file_appears_once_every_loop_has_done_a_round(tmp_path: Path) -> None:
    path, clock = tmp_path / "run" / "health.json", FrozenClock()
    async with health.HealthFile(path, clock, BOTH) as beats:
        tick, round_ = beats.recorder(health.DISPATCHER), beats.recorder(health.RECONCILER)
        tick()
        clock.advance(2)
        tick()
        await settled(beats)
        assert not path.exists(), "not ready before the reconciler's first pass"
        round_()
        await settled(beats)
    assert loops_in(path) == {
        "dispatcher": clock.now().isoformat(),
        "reconciler": clock.now().isoformat(),
    }
    assert not list(path.parent.glob(".*")), "no partial file left behind"


async def test_it_is_rewritten_at_most_once_a_second(tmp_path: Path) -> None:
    path, clock = tmp_path / "health.json", FrozenClock()
    async with health.HealthFile(path, clock, [health.DISPATCHER]) as beats:
        beats.record(health.DISPATCHER)
        await settled(beats)
        first = loops_in(path)
        clock.advance(0.5)
        beats.record(health.DISPATCHER)
        await settled(beats)
        assert loops_in(path) == first
        clock.advance(0.5)
        beats.record(health.DISPATCHER)
        await settled(beats)
    assert loops_in(path) == {"dispatcher": clock.now().isoformat()}


async def test_a_file_from_an_earlier_run_is_removed_at_start(tmp_path: Path) -> None:
    path = tmp_path / "health.json"
    path.write_text('{"pid": 1, "loops": {"dispatcher": "2025-01-01T00:00:00+00:00"}}')
    async with health.HealthFile(path, FrozenClock(), BOTH):
        assert not path.exists(), "an old file must not say ready for this process"


async def test_without_a_path_nothing_is_written(tmp_path: Path) -> None:
    async with health.HealthFile(None, FrozenClock(), BOTH) as beats:
        beats.record(health.DISPATCHER)
        beats.record(health.RECONCILER)
        assert beats._writing is None
    assert not list(tmp_path.iterdir())


def test_a_loop_it_does_not_know_is_refused() -> None:
    beats = health.HealthFile(None, FrozenClock(), [health.DISPATCHER])
    with pytest.raises(ValueError, match="reconciler"):
        beats.recorder(health.RECONCILER)


async def test_a_path_that_cannot_be_used_stops_corral_at_start(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    path = tmp_path / "file" / "health.json"  # its folder is a file
    with pytest.raises(errors.ConfigError, match="health_file .* cannot use it"):
        async with health.HealthFile(path, FrozenClock(), BOTH):
            pass


async def test_a_write_that_fails_later_is_logged_once_and_never_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder, clock = tmp_path / "run", FrozenClock()
    async with health.HealthFile(folder / "health.json", clock, [health.RECONCILER]) as beats:
        folder.rmdir()
        folder.write_text("")  # the folder is gone, and a file took its name
        for _ in range(3):
            beats.record(health.RECONCILER)
            await settled(beats)
            clock.advance(health.WRITE_EVERY)
        folder.unlink()
        beats.record(health.RECONCILER)
        await settled(beats)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "cannot write it" in warnings[0]
    assert loops_in(folder / "health.json") == {"reconciler": clock.now().isoformat()}


# --- reading it ------------------------------------------------------------------------------------


def written(tmp_path: Path, **ages: float) -> tuple[Path, FrozenClock]:
    """A health file whose loops finished a round `ages` seconds before the clock's now."""
    clock = FrozenClock()
    loops = {name: (clock.now() - timedelta(seconds=s)).isoformat() for name, s in ages.items()}
    path = tmp_path / "health.json"
    path.write_text(json.dumps({"pid": 42, "loops": loops}))
    return path, clock


def test_fresh_loops_are_healthy(tmp_path: Path) -> None:
    path, clock = written(tmp_path, dispatcher=0.4, reconciler=12)
    said = health.check(path, now=clock.now(), max_age=timedelta(seconds=60))
    assert said == "ok: dispatcher tick 0.4s ago, reconciler pass 12.0s ago (process 42)"


def test_a_stale_loop_is_named(tmp_path: Path) -> None:
    path, clock = written(tmp_path, dispatcher=0.4, reconciler=95)
    with pytest.raises(errors.Unhealthy, match="reconciler's last pass ended 95.0s ago") as exc:
        health.check(path, now=clock.now(), max_age=timedelta(seconds=60))
    assert "more than the 60.0s allowed" in str(exc.value)
    assert "process 42" in str(exc.value)


def test_readiness_asks_only_for_the_file(tmp_path: Path) -> None:
    path, clock = written(tmp_path, dispatcher=3600)
    assert health.check(path, now=clock.now(), max_age=None).startswith("ok: dispatcher tick")


def test_a_missing_file_is_unhealthy(tmp_path: Path) -> None:
    with pytest.raises(errors.Unhealthy, match="no health file: corral has not finished"):
        health.check(tmp_path / "health.json", now=FrozenClock().now(), max_age=None)


@pytest.mark.parametrize(
    "text", ["", "{", "[]", '{"pid": 1}', '{"pid": 1, "loops": {"dispatcher": "soon"}}']
)
def test_a_file_that_is_not_a_health_file_is_unhealthy(tmp_path: Path, text: str) -> None:
    path = tmp_path / "health.json"
    path.write_text(text)
    with pytest.raises(errors.Unhealthy, match="not a corral health file"):
        health.check(path, now=FrozenClock().now(), max_age=None)


def test_a_file_with_no_loop_is_unhealthy(tmp_path: Path) -> None:
    path, clock = written(tmp_path)
    with pytest.raises(errors.Unhealthy, match="records no loop"):
        health.check(path, now=clock.now(), max_age=None)
