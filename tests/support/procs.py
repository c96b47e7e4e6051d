"""Which local processes still run for a test: what a launch started can write nothing more
once none of them is alive, so a test can wait for that instead of sleeping."""

from __future__ import annotations

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
