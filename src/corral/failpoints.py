"""Named failpoints: places where a crash test can make corral die, exactly there.

Off unless the CORRAL_FAILPOINTS environment variable names them, e.g.

    CORRAL_FAILPOINTS=after_claim_commit:crash
    CORRAL_FAILPOINTS=after_launch:crash,mid_repair:error

`crash` ends the process at once with os._exit, skipping every clean-up, as SIGKILL
would; `error` raises FailpointError. A failpoint that fires once per process is enough:
the test restarts the process and checks that nothing was lost or done twice.
"""

from __future__ import annotations

import functools
import os

from corral import errors

ENV = "CORRAL_FAILPOINTS"
CRASH_EXIT_CODE = 137  # what a shell shows for a process killed by SIGKILL

NAMES = frozenset(
    {
        "after_claim_commit",  # the claim committed; nothing launched yet
        "after_launch",  # the first attempt of a tick is on its platform
        "before_record_running",  # every launch of a tick is done; `running` not yet written
        "mid_completion",  # attempts ended inside the completion's transaction, jobs not yet
        "after_job_end",  # jobs ended (their callback jobs made) and committed; none sent yet
        "mid_repair",  # the reconciler relaunched an attempt and has not recorded it yet
        "after_alerts_written",  # the alerter's messages are in the outbox; none delivered
    }
)
ACTIONS = frozenset({"crash", "error"})


def hit(name: str) -> None:
    """Do what CORRAL_FAILPOINTS says for `name` (usually nothing)."""
    action = _actions().get(name)
    if action == "crash":
        os._exit(CRASH_EXIT_CODE)
    if action == "error":
        raise errors.FailpointError(f"failpoint {name} fired")


def reset() -> None:
    """Read CORRAL_FAILPOINTS again (for tests that change it in-process)."""
    _actions.cache_clear()


@functools.cache
def _actions() -> dict[str, str]:
    spec = os.environ.get(ENV, "").strip()
    actions = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, action = item.partition(":")
        if name not in NAMES or action not in ACTIONS:
            raise errors.ConfigError(
                f"{ENV}: {item!r} is not NAME:ACTION; names: {', '.join(sorted(NAMES))};"
                f" actions: {', '.join(sorted(ACTIONS))}"
            )
        actions[name] = action
    return actions
