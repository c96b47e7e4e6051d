"""Running a tenant's command as a stranger to corral: its own uid, or a bubblewrap sandbox.

A tenant granted `process` runs code corral's operator never read, on corral's host. Its
commands must not reach what corral holds (the settings file, the database, the keys),
nor each other. Two ways make them strangers, and they combine:

- `uid_range` (corral runs as root): each attempt runs under a uid and gid of its own,
  picked from the range among those no process holds. It cannot read another attempt's
  files or /proc/PID/environ, nor corral's (root's), and cannot signal either. When the
  command ends, every process left with its uid is killed, so the uid is clean before
  another attempt gets it.
- `sandbox = "bwrap"` (Debian's bubblewrap): the command runs in its own user, mount, PID,
  IPC and UTS namespaces, seeing the system's programs and libraries read-only, its run
  folder read-only, its `work/` folder writable, a private /tmp, and none of corral's
  paths. The network is the host's: jobs call services.

Either way its environment is built from an allow-list, never from corral's own
(`environment`), and its run folder is corral's: owned by root, readable by the attempt's
group only, with a `work/` folder (its HOME, and its working folder unless the spec names
one) that belongs to the attempt's user.

Standard library only: the supervisor (process_shim.py) loads this file by its path.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import random
import shutil
import signal
import subprocess
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

WORK = "work"
"""The folder of a run folder that belongs to the attempt's user: its HOME."""

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
"""A stranger's PATH unless its spec sets one: corral's own may name corral's folders."""

KEPT = ("LANG", "LC_ALL", "TZ")
"""What a stranger's environment keeps of corral's: how to read text and time."""

SYSTEM = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt")
"""What a sandbox shows of the host, read-only: programs, libraries and their settings."""

BWRAP = "bwrap"
SETPRIV = "setpriv"


# --- the environment --------------------------------------------------------------------------


def environment(
    corral_env: Mapping[str, str],
    spec_env: Mapping[str, str],
    attempt_env: Mapping[str, str],
    *,
    work: Path,
) -> dict[str, str]:
    """A stranger's environment: PATH, LANG, LC_ALL and TZ as corral has them (PATH a safe
    default), HOME its work folder, then the spec's `env`, then the attempt's CORRAL_
    variables (which no spec overrides; a stranger's launch carries no database URL:
    executors.base.Reaches). Nothing else of corral's."""
    env = {k: corral_env[k] for k in KEPT if k in corral_env}
    env["PATH"] = SAFE_PATH
    env["HOME"] = str(work)
    env.update(spec_env)
    env.update(attempt_env)
    return env


# --- uids ---------------------------------------------------------------------------------------


def uids_running(lo: int, hi: int) -> set[int]:
    """The uids in [lo, hi] that some process of this host runs as (real or effective)."""
    used = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        for uid in _uids_of(entry.name):
            if lo <= uid <= hi:
                used.add(uid)
    return used


def _uids_of(pid: str) -> list[int]:
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Uid:"):
                    return [int(u) for u in line.split()[1:3]]
    except (OSError, ValueError):
        pass  # gone since the listing
    return []


UIDS = ".uids"
"""The folder of a root's uid leases: `<root>/.uids/<uid>`, locked (flock) while an attempt
runs under that uid and until what it left is gone, so no two supervisors give it out."""


def pick_uid(lo: int, hi: int, taken: Collection[int], leases: Path) -> tuple[int, int]:
    """A uid of [lo, hi] that no process runs as, no attempt starting here holds (`taken`)
    and no supervisor of this root has leased, at random (corrals of other roots sharing a
    range rarely reach for the same one): the uid and its lease, a descriptor held locked
    until the attempt's processes and files are gone. OSError (EAGAIN) when every uid of
    the range is in use."""
    busy = uids_running(lo, hi) | set(taken)
    size = hi - lo + 1
    os.makedirs(leases, mode=0o700, exist_ok=True)
    tried = 0
    while len(busy) < size and tried < 256:
        uid = (
            random.randint(lo, hi)
            if tried < 64
            else next(u for u in range(lo, hi + 1) if u not in busy)
        )
        tried += 1
        if uid in busy:
            continue
        lease = os.open(leases / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lease, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lease)
            busy.add(uid)
            continue
        if uid in uids_running(uid, uid):  # took a process since the first look
            os.close(lease)
            busy.add(uid)
            continue
        return uid, lease
    raise BlockingIOError(errno.EAGAIN, f"every uid of {lo}-{hi} runs an attempt")


def kill_uid(uid: int) -> int:
    """SIGKILL every process running as `uid`; how many it found."""
    killed = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and uid in _uids_of(entry.name):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
    return killed


SWEPT = ("/tmp", "/var/tmp", "/dev/shm")
"""The host's shared folders where an attempt under its own uid (no sandbox) may leave files
that a later attempt given the same uid would find: what is the uid's there is removed."""


def clean_up_uid(uid: int, *, passes: int = 20) -> None:
    """What an attempt under `uid` left behind, gone: SIGKILL every process running as it,
    pass after pass until a pass finds none (one that forks as it dies is found again), and
    remove what it owns at the top of the shared temporary folders."""
    for _ in range(passes):
        if not kill_uid(uid):
            break
    for shared in SWEPT:
        try:
            entries = list(os.scandir(shared))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
                if st.st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)  # never follows a link
                else:
                    os.unlink(entry.path)
            except OSError:
                continue


def signal_run(pgid: int, sig: signal.Signals, *, sandboxed: bool) -> None:
    """Send `sig` to a command's process group. In a sandbox the group's leader is
    bubblewrap's monitor, which a SIGTERM would kill at once (recording the run ended while
    the command still winds down, and cutting its grace): it gets SIGKILL only, and any
    other signal goes to the rest of the group, the command among them."""
    if not sandboxed or sig == signal.SIGKILL:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        return
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != pgid and _group_of(entry.name) == pgid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), sig)


def _group_of(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            after = fh.read().rpartition(b")")[2].split()
        return int(after[2])  # state, ppid, pgrp
    except (OSError, ValueError, IndexError):
        return None


# --- the run folder -----------------------------------------------------------------------------


def hand_over(folder_fd: int, uid: int | None) -> None:
    """Make a run folder (held by `folder_fd`) a stranger's: still root's, but reachable by
    the attempt's group alone (0750: its files, the payload and logs, read-only to it), with
    a `work/` folder the attempt's user owns (0700). Without a uid (a sandbox alone) the
    folder stays corral's user's, and the sandbox shows the command nothing else of it."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(WORK, 0o700, dir_fd=folder_fd)
    if uid is None:
        return
    os.chown(WORK, uid, uid, dir_fd=folder_fd, follow_symlinks=False)
    os.fchown(folder_fd, 0, uid)
    os.fchmod(folder_fd, 0o750)


# --- the command line ---------------------------------------------------------------------------


def argv(
    command: list[str],
    *,
    env: Mapping[str, str],
    uid: int | None,
    sandbox: str | None,
    run_dir: Path,
    cwd: Path,
    hide: Iterable[str] = (),
    shown: Iterable[str] = (),
) -> list[str]:
    """The command as a stranger runs it: under `setpriv` to its uid and gid (no
    supplementary groups, no new privileges), then in bubblewrap when `sandbox`, and last
    `env -i` with the command's environment `env`. The wrappers themselves run on
    `wrapper_env` only: setpriv runs as root, and a variable of the tenant's
    (LD_PRELOAD, ...) must never reach a program before it has dropped root. `shown`: more
    host folders the sandbox shows read-only (the attempt API's socket)."""
    out: list[str] = []
    if uid is not None:
        out += [_tool(SETPRIV), f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        out += ["--no-new-privs", "--"]
    if sandbox == "bwrap":
        out += bwrap_args(run_dir=run_dir, cwd=cwd, hide=hide, shown=shown)
    out += [ENV, "-i", *(f"{k}={v}" for k, v in env.items())]
    return out + command


ENV = "/usr/bin/env"
"""What sets a stranger's environment once it runs as itself (coreutils' env)."""


def wrapper_env(run_dir: Path) -> dict[str, str]:
    """All the environment the wrappers (setpriv, bwrap, env) get: a fixed PATH, and the
    run folder by which corral finds every process of the run."""
    return {"PATH": SAFE_PATH, "CORRAL_RUN_DIR": str(run_dir)}


def bwrap_args(
    *, run_dir: Path, cwd: Path, hide: Iterable[str] = (), shown: Iterable[str] = ()
) -> list[str]:
    """bubblewrap's arguments, up to the command: the namespaces, the system read-only,
    corral's paths under it hidden, the run folder read-only and its work folder writable."""
    out = [_tool(BWRAP), "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    out += ["--unshare-cgroup-try"]
    mounted = []
    for path in SYSTEM:
        if os.path.islink(path):
            out += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            out += ["--ro-bind", path, path]
            mounted.append(path)
    out += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for path in hide:  # corral's own, where the system's folders would show it
        if not any(path == m or path.startswith(m + "/") for m in mounted):
            continue
        if os.path.isdir(path):
            out += ["--tmpfs", path]
        elif os.path.lexists(path):
            out += ["--ro-bind", "/dev/null", path]
    for path in shown:
        out += ["--ro-bind-try", path, path]
    work = run_dir / WORK
    out += ["--ro-bind", str(run_dir), str(run_dir), "--bind", str(work), str(work)]
    return [*out, "--chdir", str(cwd), "--"]


def _tool(name: str) -> str:
    found = shutil.which(name, path=SAFE_PATH + ":/usr/sbin:/sbin")
    if found is None:
        raise FileNotFoundError(f"{name} is not installed")
    return found


# --- the check at start -------------------------------------------------------------------------


def probe(*, uid_range: tuple[int, int] | None, sandbox: str | None, scratch: Path) -> str | None:
    """Why strangers cannot run here, or None: a uid range needs root and setpriv; a
    sandbox needs bwrap able to make its namespaces (tried, as an attempt would run it, in
    a scratch run folder under `scratch`)."""
    if uid_range is not None and (why := _uid_range_problem()) is not None:
        return why
    if sandbox is None:
        return None
    if uid_range is None and os.geteuid() == 0:
        return (
            "executors.process.sandbox: corral runs as root, so a sandbox alone would run"
            " commands as root; set executors.process.uid_range too"
        )
    if shutil.which(BWRAP, path=SAFE_PATH + ":/usr/sbin:/sbin") is None:
        return (
            "executors.process.sandbox = 'bwrap': bwrap is not installed (Debian: apt-get"
            " install bubblewrap)"
        )
    return _try_sandbox(sandbox, None if uid_range is None else uid_range[0], Path(scratch))


def _uid_range_problem() -> str | None:
    """Why commands cannot run as other users here (not root, no setpriv), or None."""
    if os.geteuid() != 0:
        return (
            "executors.process.uid_range: corral must run as root to start commands as other users"
        )
    if shutil.which(SETPRIV, path=SAFE_PATH + ":/usr/sbin:/sbin") is None:
        return "executors.process.uid_range: setpriv (util-linux) is not installed"
    return None


def _try_sandbox(sandbox: str, uid: int | None, run_dir: Path) -> str | None:
    """Run /bin/true in `sandbox` as an attempt would, in the scratch run folder `run_dir`
    (removed after); why it could not, or None."""
    run_dir.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if not os.path.isdir(run_dir / WORK):
            hand_over(fd, uid)
    finally:
        os.close(fd)
    tried = argv(
        ["/bin/true"], env={}, uid=uid, sandbox=sandbox, run_dir=run_dir, cwd=run_dir / WORK
    )
    try:
        done = subprocess.run(
            tried, env=wrapper_env(run_dir), capture_output=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"executors.process.sandbox = 'bwrap': bwrap could not run: {exc}"
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip()
        return (
            "executors.process.sandbox = 'bwrap': bwrap cannot make its namespaces here"
            f" ({said or f'exit {done.returncode}'}): allow unprivileged user namespaces"
            " (sysctl kernel.unprivileged_userns_clone=1) or unset the setting"
        )
    return None


def unreachable(path: Path) -> Path | None:
    """The first folder from / down to `path` that other users cannot pass through."""
    for folder in (*reversed(path.parents), path):
        if not os.stat(folder).st_mode & 0o001:
            return folder
    return None


def describe(isolation: Mapping[str, Any]) -> str:
    """How strangers run, in a few words, for the log."""
    parts = []
    if isolation.get("uids"):
        lo, hi = isolation["uids"]
        parts.append(f"each under its own uid of {lo}-{hi}")
    if isolation.get("sandbox"):
        parts.append(f"in a {isolation['sandbox']} sandbox")
    return " and ".join(parts)
