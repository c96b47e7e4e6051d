"""The `process` executor's settings, `[executors.process]`: where run folders live, how
long they stay, and how a tenant's commands run apart from corral.

Light on purpose: every start-up reads it (through the executor's registration), and it
imports nothing of the executor itself.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from corral import durations, launching


def _uid_range(given: str) -> tuple[int, int]:
    """`START-END` as two uids; ValueError naming the rule."""
    start, sep, end = given.partition("-")
    if not sep or not start.isdigit() or not end.isdigit():
        raise ValueError(f"{given!r} is not START-END, e.g. 100000-165535")
    lo, hi = int(start), int(end)
    if not 1000 <= lo <= hi <= 4_294_967_294:
        raise ValueError(
            f"{given!r}: the uids must be 1000 <= START <= END <= 4294967294, clear of the"
            " system's accounts; pick a range no person's account uses, e.g. 100000-165535"
        )
    return lo, hi


class ProcessExecutorSettings(BaseModel):
    """The embedded `process` executor."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    root: Path | None = Field(None, description="Run folders live here; default <state_dir>/runs.")
    retention: durations.Duration = Field(
        timedelta(days=7),
        description="A finished run's folder (its logs, its exit) is removed this long after"
        " it finished; longer than timeouts.recovery_grace, so recovery always reads it first.",
    )
    log_bytes: int = Field(
        launching.STREAM_BYTES,
        ge=0,
        le=1024 * 1024,
        description="How much of the end of a command's stdout, and of its stderr, the run log"
        " keeps when it ends.",
    )
    uid_range: str | None = Field(
        None,
        description="START-END, e.g. 100000-165535: the commands of tenants granted `process`"
        " each run under a uid and gid of their own from this range (corral runs as root)."
        " The operator's own process jobs run as corral's user.",
    )
    sandbox: Literal["bwrap"] | None = Field(
        None,
        description="`bwrap`: the commands of tenants granted `process` run in a bubblewrap"
        " sandbox (their own namespaces, the system read-only, none of corral's paths)."
        " corral refuses to start where bwrap is missing or cannot make namespaces.",
    )

    @field_validator("uid_range")
    @classmethod
    def _uids(cls, given: str | None) -> str | None:
        if given is not None:
            _uid_range(given)
        return given

    @property
    def uids(self) -> tuple[int, int] | None:
        """uid_range as its first and last uid."""
        return None if self.uid_range is None else _uid_range(self.uid_range)

    @property
    def strangers(self) -> bool:
        """Whether a tenant's process jobs can run as strangers to corral."""
        return self.uid_range is not None or self.sandbox is not None
