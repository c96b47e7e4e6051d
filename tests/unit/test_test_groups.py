"""The suite's own grouping: under `make test` (pytest-xdist, `--dist loadgroup`) a module
marked with an xdist_group runs on one worker, so its module fixtures (a corral serving,
a browser) are set up once. pytest 9.2 stored a test's id where pytest-xdist 3.8 could not
add the group to it, and every group was split over the workers without a word."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.xdist_group("test-groups")


def test_a_grouped_test_carries_its_group_to_the_scheduler(request: pytest.FixtureRequest) -> None:
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("run without pytest-xdist's --dist loadgroup: no groups to keep")
    assert request.node.nodeid.endswith("@test-groups"), (
        f"{request.node.nodeid}: pytest-xdist did not add the group to the test's id, so"
        " `--dist loadgroup` spreads each group over the workers (see pyproject's pin of pytest)"
    )
