"""Which local processes still run for a test: what a launch started can write nothing more
once none of them is alive, so a test can wait for that instead of sleeping; and, at its
end, killing those it left."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not: nobody may reap it here)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def holds_under(proc: Path, root: Path) -> bool:
    """Whether the process `proc` (/proc/<pid>) holds a file or folder under `root` open:
    a shim holds its run folder (or the `.tmp-` folder it is about to claim)."""
    inside = f"{root}/"
    try:
        fds = list((proc / "fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        try:
            if str(fd.readlink()).startswith(inside):
                return True
        except OSError:
            continue
    return False


def running_under(root: Path) -> list[int]:
    """The live pids that run in a run folder under `root` (their CORRAL_RUN_DIR) or
    supervise one (a shim, which holds its folder open)."""
    inside = f"{root}/".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue  # gone, or not ours to read
        in_folder = any(var.startswith(b"CORRAL_RUN_DIR=" + inside) for var in environ)
        if (in_folder or holds_under(entry, root)) and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def kill_leftovers(root: Path) -> None:
    """Kill the command groups and shims of unfinished runs, so no test leaves processes;
    also those whose run folder a test removed (found by their environment or arguments)."""
    for pid in running_under(root):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    if not root.is_dir():
        return
    for run_dir in root.iterdir():
        if run_dir.name.startswith(".") or (run_dir / "exit.json").exists():
            continue
        for pid_file, kill in (("child.pid", os.killpg), ("shim.pid", os.kill)):
            with contextlib.suppress(OSError, ValueError, KeyError):
                kill(json.loads((run_dir / pid_file).read_text())["pid"], signal.SIGKILL)
