"""The supervisor that the `process` executor puts above every command it runs.

corral may exit, crash or restart while a command runs; this small program stays behind,
so that what became of the command is always written down. It is a standalone script
(run as `python -I process_shim.py <tmp dir> <run dir> <kill grace seconds>`, the run
dir an absolute path) that imports only the standard library, so it starts fast and never
depends on corral.

What it does, in order:

1. Detaches (forks; the parent exits at once, so the launcher never keeps a child).
2. Claims the launch name: `os.rename(<tmp dir>, <run dir>)`. The rename is atomic, so
   of any number of shims racing for one name exactly one wins; a loser removes its
   tmp dir, answers `exists` and starts nothing. The rename is made holding the root
   folder's lock shared (`flock`); a relaunch holds it exclusively while it looks for
   the processes of an earlier copy and kills them, so a launch never claims its
   name between that search finding no folder and the kill.
3. Starts the command in its own process group, output to `stdout.log`/`stderr.log`,
   records `child.pid` (pid, /proc start time, `started_at`) and answers `started`.
   Besides the launch's own environment, the command gets `CORRAL_RUN_DIR`: the run
   folder's absolute path, where it finds its logs, and by which corral finds every
   process of the run (its descendants inherit it).
4. Waits, enforcing the deadline, a `cancel` request and its own SIGTERM by signalling
   the command's process group: SIGTERM, then SIGKILL after a grace. A run folder that
   disappears is a stop too: once its folder is deleted, or replaced by another one
   under the same path, nothing can observe the run any more and recovery may launch the
   name again, so the command must not go on beside a new copy.
5. Writes `exit.json` atomically (tmp file, fsync, rename), unless its folder is gone.

The claimed folder is held open from before the claim, and every later file is written
relative to that descriptor: a write lands in the folder this shim claimed or fails,
never in a new folder that a relaunch made under the same path.

The answer is one line on stdout, which the launcher reads; afterwards stdout and
stderr no longer point at the launcher (stderr goes to `shim.log`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

POLL_SECONDS = 0.05
"""How often the wait loop looks for a cancel request, a passed deadline or a lost folder."""

START_FAILED_EXIT_CODE = 127
"""The exit code recorded when the command cannot even be started (as a shell does)."""

LOGS = ("stdout.log", "stderr.log")
"""Where the command's output goes, in its run folder."""

FOLDER_GONE = "run folder removed"
"""Why a command was stopped whose run folder was deleted or replaced (never recorded:
there is no folder left to record it in)."""


# --- the run folder, held open ---------------------------------------------------------------


class RunFolder:
    """A folder held by a descriptor: its files are read and written relative to it, so they
    land in this very folder (or fail once it is deleted), whatever is at its path since."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        st = os.fstat(self.fd)
        # While the descriptor is open the folder's inode cannot be reused, so another
        # folder made later under this path always differs in (device, inode).
        self.identity = (st.st_dev, st.st_ino)

    def still_mine(self) -> bool:
        """Whether the folder at `path` is still this one: not deleted, not replaced."""
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError:  # cannot tell (EACCES, EIO...): never stop a command on a doubt
            return True
        return (st.st_dev, st.st_ino) == self.identity

    def open(self, name: str, flags: int) -> int:
        """A descriptor for the file `name` in this folder."""
        return os.open(name, flags | os.O_CLOEXEC, 0o644, dir_fd=self.fd)

    def exists(self, name: str) -> bool:
        """Whether this folder holds a file `name`."""
        try:
            os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return True

    def read_json(self, name: str) -> Any:
        """The JSON in this folder's file `name`."""
        with open(self.open(name, os.O_RDONLY), encoding="utf-8") as fh:
            return json.load(fh)

    def write_json_atomic(self, name: str, data: Any) -> None:
        """Write `data` as JSON so that readers see either nothing or the whole file."""
        tmp = f".{name}.tmp"
        fd = self.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        with open(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.rename(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        os.fsync(self.fd)  # the rename survives a power cut


@contextlib.contextmanager
def claims_lock(root: Path, exclusive: bool = False) -> Iterator[None]:
    """Hold the lock on `root` that claims take shared and a relaunch's search for an
    earlier copy's processes takes exclusively (process.py uses this very function)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # which releases the lock


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file inside `path` survive a power cut."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- small helpers -----------------------------------------------------------------------------


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


def now_iso() -> str:
    """The current UTC time as an ISO 8601 string."""
    return datetime.now(UTC).isoformat()


def announce(answer: str) -> None:
    """Tell the launcher `answer` on stdout, then let go of the launcher's pipe.

    The launcher may have died since it started us (corral killed mid-launch): then nobody
    reads the answer, and the launch goes on all the same; recovery adopts it.
    """
    try:
        sys.stdout.write(answer + "\n")
        sys.stdout.flush()
    except OSError:  # BrokenPipeError: the launcher is gone
        pass
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)


def redirect_stderr(folder: RunFolder) -> None:
    """Send this shim's own complaints to `shim.log` instead of the launcher's pipe."""
    fd = folder.open("shim.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 2)
    os.close(fd)


# --- claiming the name -----------------------------------------------------------------


def claim(tmp: Path, final: Path) -> RunFolder | None:
    """Rename `tmp` to `final` and hold it; None (and `tmp` removed) when `final` exists."""
    # Opened before the rename, so the descriptor is the claimed folder itself: opening
    # `final` afterwards could already find another one there.
    folder = RunFolder(tmp)
    me = os.getpid()
    folder.write_json_atomic("shim.pid", {"pid": me, "start_time": proc_start_time(me)})
    try:
        with claims_lock(final.parent):
            os.rename(tmp, final)
    except OSError as exc:
        os.close(folder.fd)
        if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        return None
    fsync_dir(final.parent)
    folder.path = final
    return folder


# --- running the command ------------------------------------------------------------------


def child_env(folder: RunFolder, launch: dict[str, Any]) -> dict[str, str]:
    """The command's environment: this machine's, the spec's, the launch's, the run folder."""
    # corral's own settings (database URL, ...) are not the job's business.
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env = {**inherited, **launch["spec"].get("env", {}), **launch["env"]}
    env["CORRAL_RUN_DIR"] = str(folder.path)  # last, so no spec can change what corral finds
    return env


def start_child(
    folder: RunFolder, launch: dict[str, Any]
) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """Start the command in its own process group; it and its `child.pid` record."""
    logs = [folder.open(name, os.O_WRONLY | os.O_CREAT | os.O_APPEND) for name in LOGS]
    try:
        child = subprocess.Popen(
            launch["spec"]["command"],
            stdin=subprocess.DEVNULL,
            stdout=logs[0],
            stderr=logs[1],
            env=child_env(folder, launch),
            cwd=launch.get("cwd"),
            process_group=0,
        )
    finally:
        for fd in logs:
            os.close(fd)
    record = {"pid": child.pid, "start_time": proc_start_time(child.pid), "started_at": now_iso()}
    folder.write_json_atomic("child.pid", record)
    return child, record


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Send `sig` to the command's whole process group, if any of it is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class Supervision:
    """The wait loop: watches the command and stops it when asked or when time is up."""

    def __init__(
        self,
        child: subprocess.Popen[bytes],
        folder: RunFolder,
        launch: dict[str, Any],
        kill_grace: float,
    ) -> None:
        self.child = child
        self.folder = folder
        self.kill_grace = kill_grace
        deadline = launch.get("deadline_seconds")
        self.deadline_at = None if deadline is None else time.monotonic() + float(deadline)
        self.stop_reason: str | None = None
        self.kill_at: float | None = None
        self.terminated = False

    def on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        """Someone stopped the shim itself (a shutdown): stop the command, then record it."""
        self.terminated = True

    def wait(self) -> int:
        """Wait for the command to end, stopping it when needed; its return code."""
        while True:
            try:
                returncode = self.child.wait(timeout=POLL_SECONDS)
            except subprocess.TimeoutExpired:
                self.tick(time.monotonic())
                continue
            # The canceller signals the group itself: the command may end before we look.
            if self.stop_reason is None and self.folder.exists("cancel"):
                self.stop_reason = "cancelled"
            return returncode

    def tick(self, now: float) -> None:
        """One look: start stopping the command, or force it once the grace is over."""
        if self.stop_reason is None:
            self.stop_reason, grace = self.stop_request(now)
            if self.stop_reason is not None:
                signal_group(self.child.pid, signal.SIGTERM)
                self.kill_at = now + grace
        elif self.kill_at is not None and now >= self.kill_at:
            signal_group(self.child.pid, signal.SIGKILL)
            self.kill_at = None

    def stop_request(self, now: float) -> tuple[str | None, float]:
        """Why the command must stop now, and the grace it gets; (None, 0) to keep going."""
        if self.terminated:
            return "supervisor terminated", self.kill_grace
        if not self.folder.still_mine():
            return FOLDER_GONE, self.kill_grace
        if self.folder.exists("cancel"):
            return "cancelled", read_cancel_grace(self.folder, self.kill_grace)
        if self.deadline_at is not None and now >= self.deadline_at:
            return "deadline exceeded", self.kill_grace
        return None, 0.0


def read_cancel_grace(folder: RunFolder, default: float) -> float:
    """The grace the canceller asked for, from the `cancel` marker file."""
    try:
        return float(folder.read_json("cancel")["grace_seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return default


def exit_record(returncode: int, stop_reason: str | None, started_at: str | None) -> dict[str, Any]:
    """What `exit.json` says about a command that ended with `returncode`."""
    if returncode < 0:
        try:
            detail = f"killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            detail = f"killed by signal {-returncode}"
    else:
        detail = f"exited with code {returncode}"
    return {
        "exit_code": returncode,
        "succeeded": returncode == 0 and stop_reason is None,
        "reason": stop_reason or detail,
        "started_at": started_at,
        "finished_at": now_iso(),
    }


def record_exit(folder: RunFolder, record: dict[str, Any]) -> None:
    """Write `exit.json`, unless the folder is gone: nobody may read it, and a relaunch may
    have made a new folder under its path since."""
    if not folder.still_mine():
        return
    with contextlib.suppress(FileNotFoundError):  # deleted since we looked
        folder.write_json_atomic("exit.json", record)


def run(folder: RunFolder, kill_grace: float) -> None:
    """Start the claimed launch's command, answer the launcher, supervise, record the end."""
    redirect_stderr(folder)
    launch = folder.read_json("launch.json")
    try:
        child, started = start_child(folder, launch)
    except (OSError, ValueError) as exc:  # ValueError: e.g. a NUL byte in an argument
        record = exit_record(START_FAILED_EXIT_CODE, None, None)
        record["reason"] = f"could not start the command: {exc}"
        record_exit(folder, record)
        announce("started")
        return
    supervision = Supervision(child, folder, launch, kill_grace)
    signal.signal(signal.SIGTERM, supervision.on_sigterm)
    announce("started")
    returncode = supervision.wait()
    # Like a container ending: whatever the command left behind in its group goes too.
    signal_group(child.pid, signal.SIGKILL)
    record_exit(folder, exit_record(returncode, supervision.stop_reason, started["started_at"]))


def main(argv: list[str]) -> int:
    """Entry point: `process_shim.py <tmp dir> <run dir> <kill grace seconds>`."""
    tmp, final, grace = Path(argv[1]), Path(argv[2]), float(argv[3])
    if os.fork() > 0:
        os._exit(0)
    try:
        folder = claim(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if folder is None:
        announce("exists")
        return 0
    run(folder, grace)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
