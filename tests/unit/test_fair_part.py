"""shares.fair_part: how much of a claim's room the flow claim may take beside the tenants
whose jobs of no flow the main claim serves after it."""

from __future__ import annotations

import pytest

from corral import shares

EVEN = shares.Weights()


@pytest.mark.parametrize(
    ("limit", "mine", "others", "weights", "part"),
    [
        (10, ["t"], {}, EVEN, 10),  # alone: all of it
        (10, ["t"], {"u": 50}, EVEN, 5),
        (10, ["t"], {"u": 50, "v": 50}, EVEN, 4),  # ceil(10 / 3)
        (10, ["t"], {"u": 50}, shares.Weights({"u": 4.0}), 2),
        (10, ["t"], {"u": 2}, EVEN, 8),  # what u's jobs leave
        (10, ["t"], {"u": 0}, EVEN, 10),  # nothing due: not waiting
        (1, ["t"], {"u": 50, "v": 50}, EVEN, 1),  # at least one
        (10, ["t", "u"], {"u": 50}, EVEN, 10),  # a tenant of both counts as the flows'
        (0, ["t"], {"u": 5}, EVEN, 0),
    ],
)
def test_fair_part(
    limit: int, mine: list[str], others: dict[str, int], weights: shares.Weights, part: int
) -> None:
    assert shares.fair_part(limit, mine, others, weights) == part
