"""api/, web/ and cli/ reach the store only through the client: none of their modules
imports corral.store (import-linter's contract says so) or reads a `.store` attribute
(a client's or a runtime's), which an import check cannot see."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "corral"
EDGES = ("api", "web", "cli")


def store_uses(path: Path) -> list[int]:
    """The lines of `path` that read an attribute named `store`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr == "store"
    ]


@pytest.mark.parametrize("edge", EDGES)
def test_the_edges_never_read_a_store_attribute(edge: str) -> None:
    found = {
        str(path.relative_to(SRC)): lines
        for path in sorted((SRC / edge).rglob("*.py"))
        if (lines := store_uses(path))
    }
    assert found == {}, "ask the client (corral.client) instead"


def test_the_check_sees_a_store_attribute(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("async def f(c):\n    return await c.store.job_get(job_id=1)\n")
    assert store_uses(sample) == [2]
