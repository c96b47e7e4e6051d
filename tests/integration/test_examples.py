"""examples/exactly_once_job.py runs under corral (serve, process executor, SQLite), and
running it again as a newer attempt replaces its output whole."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from corral import config, model
from corral.sinks import resolve_async, rows_of
from tests.integration.conftest import Corral

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "exactly_once_job.py"
J = model.JobState


async def test_the_exactly_once_example_runs_and_publishes(corral: Corral, tmp_path: Path) -> None:
    warehouse = tmp_path / "warehouse"
    command = [sys.executable, str(EXAMPLE), str(warehouse), "2026-11-30"]
    first, _ = await corral.client.submit(spec={"command": command})
    await corral.wait(first, J.SUCCEEDED)
    second, _ = await corral.client.submit(spec={"command": command}, code_version="git-abc123")
    await corral.wait(second, J.SUCCEEDED)
    settings = config.Settings(database_url=corral.database_url)
    folder = await resolve_async("orders/day=2026-11-30", settings=settings)
    assert folder is not None
    name = folder.rsplit("/", 1)[1]
    fence = (await corral.client.job(second)).attempts[0].id
    assert name.startswith(f"fence={fence}-")
    orders = list(rows_of(folder))
    engine = sa.create_engine(f"sqlite:///{warehouse / 'warehouse.db'}")
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT store, total, fence FROM store_totals")).all()
        versions = conn.execute(sa.text("SELECT DISTINCT code_version FROM store_totals")).all()
    engine.dispose()
    expected: dict[str, int] = {}
    for order in orders:
        expected[order["store"]] = expected.get(order["store"], 0) + order["amount"]
    assert {store: total for store, total, _ in rows} == expected, "totals match the partition"
    assert {written for _, _, written in rows} == {fence}
    assert versions == [("git-abc123",)], "submitted with the job, stamped by the sink"
