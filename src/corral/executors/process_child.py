"""Starting a `process` run's command as the supervisor's child: its environment (this
machine's, the spec's, the launch's, CORRAL_RUN_DIR and the payload's file), the program
found in its own PATH, a stranger's command wrapped to run as its uid (and in its sandbox),
and one posix_spawn in a process group of its own, recorded in `child.pid`. Standard
library only, loaded by path by the supervisor (process_shim.py) as a script.
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

if __package__:
    from corral.executors import process_folder
    from corral.executors import process_sandbox as sandbox
else:  # pragma: no cover - loaded by the supervisor, run as a script, after these two
    process_folder = sys.modules["process_folder"]
    sandbox = sys.modules["process_sandbox"]


PAYLOAD_FILE = "payload.json"
"""The launch's payload as JSON text, in its run folder, read-only: present only when the
launch has one (a null payload makes no file, and no CORRAL_PAYLOAD_FILE)."""

PAYLOAD_VARIABLES = ("CORRAL_PAYLOAD_FILE", "CORRAL_PAYLOAD")
"""What a job reads its payload from: only corral sets them (never a spec's env)."""


def proc_start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat: when the process started, in clock ticks since boot.

    Stored beside a pid so that a later reader can tell the process from another one
    that happens to get the same pid."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            stat = fh.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = stat.rpartition(")")[2].split()
    return int(fields[19])


@functools.cache
def inherited_env() -> dict[str, str]:
    """What every command inherits of the supervisor's environment (which never changes):
    all but corral's own settings (database URL, ...), which are not the job's business."""
    return {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}


def child_env(
    folder: process_folder.RunFolder, launch: dict[str, Any], *, payload: bool
) -> dict[str, str]:
    """The command's environment: this machine's, the spec's, the launch's, the run folder,
    and the payload's file when the launch has a `payload`. A stranger's (a tenant's
    command, see process_sandbox) has none of this machine's but an allow-list."""
    spec_env, launch_env = launch["spec"].get("env", {}), launch["env"]
    if launch.get("stranger"):
        work = folder.path / sandbox.WORK
        env = sandbox.environment(os.environ, spec_env, launch_env, work=work)
    else:
        env = {**inherited_env(), **spec_env, **launch_env}
    for name in PAYLOAD_VARIABLES:  # corral says where the payload is, or that there is none
        env.pop(name, None)
    if payload:
        env["CORRAL_PAYLOAD_FILE"] = str(folder.path / PAYLOAD_FILE)
    env["CORRAL_RUN_DIR"] = str(folder.path)  # last, so no spec can change what corral finds
    return env


RESTORED_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ)
"""Signals Python ignores, which a command gets back at their defaults (an ignored signal
stays ignored across exec), as subprocess's `restore_signals` does."""


def program(argv0: str, env: dict[str, str]) -> str:
    """The file to run for a command's first word: searched in the command's own PATH, as
    subprocess and the shell do, unless it is a path."""
    if os.sep in argv0:
        return argv0  # relative ones from the command's folder (the cwd at the spawn)
    found = shutil.which(argv0, path=os.pathsep.join(os.get_exec_path(env)))
    if found is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv0)
    return found


def start_child(
    folder: process_folder.RunFolder,
    launch: dict[str, Any],
    *,
    payload: bool = False,
    uid: int | None = None,
) -> tuple[int, dict[str, Any]]:
    """Start the command in its own process group; its pid and its `child.pid` record.
    `payload`: the folder holds the launch's PAYLOAD_FILE. A stranger's command (the
    launch's `stranger`) runs under `uid` and in its sandbox, if any, from its work folder.

    A command starts with posix_spawn (a vfork and an exec, no more): the supervisor
    starts every command, so this is its hot path. It runs in `cwd`, which the supervisor
    moves to itself first (it only ever uses absolute paths); every descriptor but the
    command's three is closed on exec (Python opens them so, and `main` makes the socket so)."""
    command = launch["spec"]["command"]
    env = child_env(folder, launch, payload=payload)
    stranger = launch.get("stranger")
    if stranger:
        command, env = _as_stranger(folder, launch, command, env, uid)
    elif cwd := launch.get("cwd"):
        os.chdir(cwd)
    pid = _spawn(folder, program(command[0], env), command, env)
    record = {
        "pid": pid,
        "start_time": proc_start_time(pid),
        "started_at": process_folder.now_iso(),
    }
    if stranger:
        record.update(uid=uid, sandboxed=bool(stranger.get("sandbox")))
    try:  # it runs now, whatever happens to its record: it is watched all the same
        folder.write_json_atomic("child.pid", record, durable=False)
    except OSError:
        traceback.print_exc()
    return pid, record


def _as_stranger(
    folder: process_folder.RunFolder,
    launch: dict[str, Any],
    command: list[str],
    env: dict[str, str],
    uid: int | None,
) -> tuple[list[str], dict[str, str]]:
    """A stranger's command and environment: the folder handed over to `uid`, the
    supervisor in its work folder, and the command wrapped to run as `uid` (in its
    sandbox, if any) with its own environment set by the wrapper."""
    stranger = launch["stranger"]
    work = stranger_cwd(folder, launch["spec"].get("cwd", ""))
    sandbox.hand_over(folder.fd, uid)
    os.chdir(work)
    program(command[0], env)  # missing: it could not start, as for anyone's command
    wrapped = sandbox.argv(
        command,
        env=env,
        uid=uid,
        sandbox=stranger.get("sandbox"),
        run_dir=folder.path,
        cwd=Path(work),
        hide=stranger.get("hide", ()),
        shown=stranger.get("shown", ()),
    )
    return wrapped, sandbox.wrapper_env(folder.path)  # the command's own is set by `env -i`


def _spawn(
    folder: process_folder.RunFolder, path: str, command: list[str], env: dict[str, str]
) -> int:
    """posix_spawn `path` in its own process group, its output to the folder's logs."""
    logs = [
        folder.open(name, os.O_WRONLY | os.O_CREAT | os.O_APPEND) for name in process_folder.LOGS
    ]
    try:
        return os.posix_spawn(
            path,
            command,
            env,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, logs[0], 1),
                (os.POSIX_SPAWN_DUP2, logs[1], 2),
            ],
            setpgroup=0,
            setsigdef=RESTORED_SIGNALS,
            setsigmask=(),
        )
    finally:
        for fd in logs:
            os.close(fd)


def stranger_cwd(folder: process_folder.RunFolder, cwd: str) -> str:
    """Where a stranger's command starts: its work folder, or a relative `cwd` inside it
    (ValueError for one that would lead out: corral, as root, must not open a folder for
    it that its own user could not reach)."""
    if Path(cwd).is_absolute() or ".." in Path(cwd).parts:
        raise ValueError(
            f"cwd: {cwd!r} leads out of the work folder; a tenant's command starts in its"
            " work folder, or a relative folder inside it"
        )
    return os.path.join(folder.path / sandbox.WORK, cwd)
