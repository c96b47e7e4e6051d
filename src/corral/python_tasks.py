"""Python tasks and the workers that run them, as plain data: a `corral worker` process and
the (task, version) pairs it reads, a job parked until some worker can read it, a task's
envelope ({task, version, data}) and how versions compare.

Pure, as corral.model is; the workers themselves are corral.worker.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from corral import model

PYTHON = "python"
"""The executor kind of a Python task: run by a `corral worker`, never by the dispatcher."""


class WorkerState(StrEnum):
    """Where a `corral worker` process is in its life."""

    RUNNING = "running"  # claims and runs tasks
    DRAINING = "draining"  # told to stop: claims nothing, finishes or hands back what it runs
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class TaskRead:
    """One (task, payload version) a worker reads, with that version's JSON Schema;
    `newest`: the version the worker writes (its task's current version)."""

    task: str
    version: int
    schema: Mapping[str, Any]
    newest: bool = False


@dataclass(frozen=True, slots=True)
class Worker:
    """A registered `corral worker` process."""

    id: str
    app: str
    app_version: str
    host: str
    pid: int
    queues: tuple[str, ...]  # empty: every queue
    concurrency: int
    state: WorkerState
    started_at: datetime
    last_seen_at: datetime
    stopped_at: datetime | None
    reads: tuple[TaskRead, ...] = ()


@dataclass(frozen=True, slots=True)
class ParkedJob:
    """A job no live worker reads, as `corral parked list` shows it: its task and payload
    version, and the lowest app version known to read it (None: no worker ever has)."""

    job: model.Job
    task: str
    version: int
    needs_app_version: str | None
    parked_at: datetime | None
    reason: str


def task_of(spec: Mapping[str, Any]) -> tuple[str, int]:
    """The (task, payload version) of a Python task's spec."""
    return str(spec["task"]), int(spec["version"])


def envelope(task: str, version: int, data: Any) -> dict[str, Any]:
    """A Python task's payload as stored: its task, its payload version and its data."""
    return {"task": task, "version": version, "data": data}


def version_key(version: str) -> tuple[int, Any]:
    """An app version as a sort key: a version as Python packages number them (PEP 440:
    `1.10.0` after `1.9.2`, `2.0.0rc1` before `2.0.0`) by its meaning; any other string (a
    git sha) after those, place by place, numbers before words."""
    from packaging.version import InvalidVersion, Version

    try:
        return (0, Version(version))
    except InvalidVersion:
        parts = re.split(r"[.\-+_]", version)
        return (1, tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in parts))
