"""The `python` executor kind: Python tasks, run by `corral worker` processes.

No dispatcher claims these jobs: a worker does, through the same fenced claim, and runs
the task's function itself (corral.worker). There is no platform to launch on, watch or
stop, so this kind is not registered among the executors a dispatcher runs; what is here
is the check of a task's spec, `{"task": NAME, "version": N}`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from corral import errors, python_tasks

KIND = python_tasks.PYTHON
_TASK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}$")


class TaskSpec:
    """Checks a Python task's spec (registry.SpecChecker)."""

    def validate_spec(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(spec) - {"task", "version"})
        if unknown:
            raise errors.InvalidInput(
                f"spec.{unknown[0]}: unknown field (a task's spec: task, version)"
            )
        task, version = spec.get("task"), spec.get("version")
        if not isinstance(task, str) or not _TASK.match(task):
            raise errors.InvalidInput(
                f"task: {task!r} must be 1-200 characters of [A-Za-z0-9_.:-], starting alphanumeric"
            )
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise errors.InvalidInput(
                f"task_version: {version!r} must be a whole number, at least 1"
            )
        return {"task": task, "version": version}


SPEC = TaskSpec()
