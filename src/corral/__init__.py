"""corral: a crash-safe job dispatcher.

No job is lost, no job is stuck, and no stale attempt can overwrite a newer one.

The names below are imported when first used, so that `import corral` (and every
`corral` command that needs little of it) starts at once.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corral.client import Client
    from corral.client.jobs import JobView
    from corral.clock import Clock, SystemClock
    from corral.config import Settings
    from corral.dispatcher import Dispatcher
    from corral.errors import CorralError, PermanentError, Stopped
    from corral.model import (
        Attempt,
        AttemptState,
        Event,
        Job,
        JobState,
    )
    from corral.runtime import connect
    from corral.timeouts import Timeouts
    from corral.worker import App, CurrentAttempt, Fresh, Pinned, current_attempt, current_task

_FROM = {
    "Client": "corral.client",
    "JobView": "corral.client.jobs",
    "Clock": "corral.clock",
    "SystemClock": "corral.clock",
    "Settings": "corral.config",
    "Timeouts": "corral.timeouts",
    "Dispatcher": "corral.dispatcher",
    "CorralError": "corral.errors",
    "PermanentError": "corral.errors",
    "Stopped": "corral.errors",
    "Attempt": "corral.model",
    "AttemptState": "corral.model",
    "Event": "corral.model",
    "Job": "corral.model",
    "JobState": "corral.model",
    "Launch": "corral.launching",
    "Observation": "corral.launching",
    "Phase": "corral.launching",
    "connect": "corral.runtime",
    "CurrentAttempt": "corral.worker",
    "current_attempt": "corral.worker",
    "App": "corral.worker",
    "Fresh": "corral.worker",
    "Pinned": "corral.worker",
    "current_task": "corral.worker",
}

__all__ = [
    "App",
    "Attempt",
    "AttemptState",
    "Client",
    "Clock",
    "CorralError",
    "CurrentAttempt",
    "Dispatcher",
    "Event",
    "Fresh",
    "Job",
    "JobState",
    "JobView",
    "Launch",
    "Observation",
    "PermanentError",
    "Phase",
    "Pinned",
    "Settings",
    "Stopped",
    "SystemClock",
    "Timeouts",
    "connect",
    "current_attempt",
    "current_task",
]


def __getattr__(name: str) -> Any:
    if (module := _FROM.get(name)) is None:
        raise AttributeError(f"module 'corral' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: the next look finds it without this hook
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_FROM})
