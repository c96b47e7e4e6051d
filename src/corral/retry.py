"""Retries: how long a failed job waits before its next attempt.

Exponential backoff with full jitter: the n-th retry waits a random time between zero and
min(cap, base * 2**(n-1)), so jobs that failed together do not come back together. The
random source is passed in, so tests (and anyone replaying an incident) get exact delays.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from corral import config


@dataclass(slots=True)
class Backoff:
    """Delays for retries: full jitter under an exponential ceiling."""

    base: float
    cap: float
    rng: random.Random = field(default_factory=random.Random)

    @classmethod
    def from_settings(cls, settings: config.Settings, rng: random.Random | None = None) -> Backoff:
        return cls(
            base=settings.retry.base.total_seconds(),
            cap=settings.retry.cap.total_seconds(),
            rng=rng or random.Random(settings.retry.seed),
        )

    def ceiling(self, attempt_no: int) -> float:
        """The longest wait after attempt `attempt_no` (1 for the first) failed."""
        exponent = min(max(attempt_no - 1, 0), 64)  # 2**64 * base is past any cap
        return min(self.cap, self.base * 2.0**exponent)

    def delay(self, attempt_no: int) -> float:
        """Seconds to wait before the attempt after `attempt_no`."""
        return self.rng.uniform(0.0, self.ceiling(attempt_no))
