"""Stopping the processes of a `process` run: a cancel (SIGTERM to the command's group,
SIGKILL after its grace), and, before a relaunch, every live process of a run whose folder
is gone, found in /proc (a command by CORRAL_RUN_DIR in its environment, a shim of an
earlier version by its arguments) and SIGKILLed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any, NamedTuple

from corral.executors import (
    process_folder,
    process_runs,
    process_sandbox,
    process_supervisor,
)


def write_json(path: Path, data: Any) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
        fh.flush()
        os.fsync(fh.fileno())


def cancel_begin(run_dir: Path, grace_seconds: float) -> bool:
    """Mark the run as cancelled and SIGTERM its command; False if there is nothing to stop."""
    with process_runs.os_errors(f"cancel {run_dir.name!r}"):
        if not run_dir.is_dir() or process_runs.has_exit(run_dir):
            return False
        marker = run_dir / "cancel"
        tmp = run_dir / ".cancel.tmp"
        write_json(tmp, {"grace_seconds": grace_seconds})
        os.rename(tmp, marker)
    signal_child_group(run_dir, signal.SIGTERM)
    return True


def signal_child_group(run_dir: Path, sig: signal.Signals) -> None:
    """Send `sig` to the command's process group, if the command is still the one we started."""
    with process_runs.os_errors(f"signal {run_dir.name!r}"):
        child = process_runs.read_pid(run_dir / "child.pid")
        if process_runs.has_exit(run_dir) or not process_runs.alive(child):
            return
        sandboxed = bool(child and child.get("sandboxed"))
        process_sandbox.signal_run(child["pid"], sig, sandboxed=sandboxed)


class RunProcess(NamedTuple):
    """A live process of a run, as /proc showed it (the start time tells it from a newer
    process that got the same pid)."""

    is_command: bool  # False sorts first: a supervisor is stopped before its command
    pid: int
    start_time: int


def stop_processes_of_run(run_dir: Path) -> set[RunProcess]:
    """SIGKILL the live processes of `run_dir`'s run (see `_processes_of_run`) and return
    them; no shim can claim the folder meanwhile (the root's lock, held exclusively)."""
    with (
        process_runs.os_errors(f"lock {run_dir.parent} to look for earlier processes"),
        process_folder.claims_lock(run_dir.parent, exclusive=True),
    ):
        found = _processes_of_run(run_dir)
        _kill_groups(found)
    return found


def _processes_of_run(run_dir: Path) -> set[RunProcess]:
    """The live processes of `run_dir`'s run, unless the folder is there (then they are the
    launch itself, and another corral may have just made it: nothing to stop)."""
    if run_dir.exists():
        return set()
    mark = f"CORRAL_RUN_DIR={run_dir}".encode()
    found = set()
    with process_runs.os_errors(f"look for earlier processes of {run_dir.name!r} in /proc"):
        me = str(os.getpid())
        entries = [e for e in os.scandir("/proc") if e.name.isdigit() and e.name != me]
    for entry in entries:
        is_command = _belongs(entry.path, run_dir, mark)
        stat = None if is_command is None else process_runs.proc_stat(int(entry.name))
        if is_command is not None and stat is not None and stat[0] != "Z":
            found.add(RunProcess(is_command, int(entry.name), stat[1]))
    return found


def _belongs(proc: str, run_dir: Path, mark: bytes) -> bool | None:
    """True: a command of the run (by its environment); False: its shim, one of an earlier
    version of this executor that ran one shim per run (by its arguments); None: neither,
    or a process gone or not ours to read. Today's supervisor serves many runs and stops a
    command whose folder went by itself: it is never one to stop."""
    try:
        with open(f"{proc}/environ", "rb") as fh:
            if mark in fh.read().split(b"\0"):
                return True
        with open(f"{proc}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except OSError:
        return None
    shim = any(arg.endswith(process_supervisor.SHIM.name.encode()) for arg in argv)
    return False if shim and str(run_dir).encode() in argv else None


def _kill_groups(found: set[RunProcess]) -> None:
    """SIGKILL each process's group (what it started goes with it), if it is still the one
    found; never corral's own group."""
    for proc in sorted(found):
        stat = process_runs.proc_stat(proc.pid)
        if stat is None or stat[1] != proc.start_time:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            group = os.getpgid(proc.pid)
            if group == os.getpgrp():
                os.kill(proc.pid, signal.SIGKILL)
            else:
                os.killpg(group, signal.SIGKILL)
