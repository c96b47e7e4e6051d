"""The supervisor that the `process` executor puts above every command it runs.

corral may exit, crash or restart while a command runs; this small program stays behind,
so that what became of the command is always written down. It is a standalone script
that imports only the standard library and never depends on corral.

It runs as a spawner (`python -I process_shim.py --spawner <fd>`, detached at once): one
warm process per executor, started once, that reads launch requests from a Unix socket
(the executor holds the other end) and forks a supervisor for each one, in a millisecond
or two instead of the tens of milliseconds a new interpreter takes. The spawner reaps its
supervisors and says on the socket when each ended: that is how the executor hears of a
finished run at once. When the executor's end closes (corral stopped, or died) the
spawner exits; the supervisors it forked go on, each in a session of its own, and
nothing they do depends on the spawner or on corral.

What a supervisor does, in order:

1. Detaches (a session of its own, so signals to corral's group do not reach it).
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

The answer (`started`, `exists`, or an error before the claim) is one line on a pipe to
the spawner, which passes it on; the supervisor's stderr goes to `shim.log` once it has
claimed its folder.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import gc
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any, NamedTuple

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


def tell(fd: int, message: dict[str, Any]) -> None:
    """Give the spawner one message (a line of JSON) on the pipe it made for this
    supervisor. It may be gone (SIGKILL): then nobody reads it, and the launch goes on all
    the same; the executor sees the run in its folder."""
    with contextlib.suppress(OSError):  # EPIPE: the spawner is gone
        os.write(fd, json.dumps(message).encode() + b"\n")


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


def run(folder: RunFolder, kill_grace: float, answer: Callable[[str], None]) -> None:
    """Start the claimed launch's command, answer the launcher, supervise, record the end."""
    redirect_stderr(folder)
    launch = folder.read_json("launch.json")
    try:
        child, started = start_child(folder, launch)
    except (OSError, ValueError) as exc:  # ValueError: e.g. a NUL byte in an argument
        record = exit_record(START_FAILED_EXIT_CODE, None, None)
        record["reason"] = f"could not start the command: {exc}"
        record_exit(folder, record)
        answer("started")
        return
    supervision = Supervision(child, folder, launch, kill_grace)
    signal.signal(signal.SIGTERM, supervision.on_sigterm)
    answer("started")
    returncode = supervision.wait()
    # Like a container ending: whatever the command left behind in its group goes too.
    signal_group(child.pid, signal.SIGKILL)
    record_exit(folder, exit_record(returncode, supervision.stop_reason, started["started_at"]))


def supervise(request: dict[str, Any], answers: int) -> int:
    """One launch, in a process forked by the spawner: claim the name, then run it (or
    answer `exists`). The answer goes on the pipe `answers`, which is then closed: the
    spawner alone says when this supervisor ended."""
    tmp, final, grace = Path(request["tmp"]), Path(request["run"]), float(request["grace"])

    def answer(word: str) -> None:
        tell(answers, {"answer": word})
        os.close(answers)

    try:
        folder = claim(tmp, final)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        lines = traceback.format_exception_only(type(exc), exc)
        tell(answers, {"error": "".join(lines).strip()})
        return 1
    if folder is None:
        answer("exists")
        return 0
    run(folder, grace, answer)
    return 0


class _Child(NamedTuple):
    ask: int  # the id of the request it serves
    answers: int  # the read end of its pipe, or -1 once that is closed


class Spawner:
    """The warm parent of every supervisor: a fork for each request on `sock`, whose answer
    it passes on, and a message (`ended`) for each supervisor it reaps. It alone writes to
    `sock`: a supervisor writes to a pipe of its own, so none ever waits for the executor."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.children: dict[int, _Child] = {}  # by pid
        self.pipes: dict[int, int] = {}  # answers fd -> pid
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)
        self.selector = selectors.DefaultSelector()
        self.pending = b""

    def serve(self) -> int:
        """Until the executor closes its end of the socket."""
        gc.freeze()  # a supervisor's collector never walks (and so copies) what it inherits
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes the select
        signal.set_wakeup_fd(self.wake_w)
        self.selector.register(self.sock, selectors.EVENT_READ)
        self.selector.register(self.wake_r, selectors.EVENT_READ)
        self.say({"spawner": os.getpid()})
        while True:
            for key, _ in self.selector.select():
                if key.fileobj is self.sock:
                    data = self.sock.recv(65536)
                    if not data:
                        return 0  # the executor is gone: its supervisors go on alone
                    self.pending += data
                    *lines, self.pending = self.pending.split(b"\n")
                    for line in lines:
                        self.fork(json.loads(line))
                elif key.fileobj == self.wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wake_r, 4096)
                else:
                    self.relay(key.fd)
            self.reap()

    def fork(self, request: dict[str, Any]) -> None:
        answers_r, answers_w = os.pipe()
        pid = os.fork()
        if pid:
            os.close(answers_w)
            os.set_blocking(answers_r, False)
            self.children[pid] = _Child(request["id"], answers_r)
            self.pipes[answers_r] = pid
            self.selector.register(answers_r, selectors.EVENT_READ)
            return
        # The supervisor: none of the spawner's machinery, a session of its own.
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            self.selector.close()
            for fd in (self.wake_r, self.wake_w, answers_r, *self.pipes):
                os.close(fd)
            self.sock.close()
            os.setsid()
            code = supervise(request, answers_w)
        finally:
            os._exit(code)

    def relay(self, fd: int) -> None:
        """Pass on what a supervisor said (its answer), with its request's id."""
        pid = self.pipes.get(fd)
        child = self.children.get(pid) if pid is not None else None
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        if child is not None:
            for line in data.splitlines():
                self.say({**json.loads(line), "id": child.ask})
        if not data:  # it closed the pipe: answered, or gone
            self.close_pipe(fd)

    def close_pipe(self, fd: int) -> None:
        pid = self.pipes.pop(fd, None)
        self.selector.unregister(fd)
        os.close(fd)
        if pid in self.children:
            self.children[pid] = self.children[pid]._replace(answers=-1)

    def reap(self) -> None:
        while self.children:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = self.children.get(pid)
            if child is None:
                continue
            if child.answers >= 0:  # what it said before it ended comes first
                with contextlib.suppress(OSError):
                    self.relay(child.answers)
                if child.answers in self.pipes:
                    self.close_pipe(child.answers)
            del self.children[pid]
            self.say({"id": child.ask, "ended": True})

    def say(self, message: dict[str, Any]) -> None:
        """One line to the executor (it reads as it goes: a wait here is short)."""
        with contextlib.suppress(OSError):  # gone: the next recv says so
            self.sock.sendall(json.dumps(message).encode() + b"\n")


def main(argv: list[str]) -> int:
    """Entry point: `process_shim.py --spawner <fd of a Unix stream socket>`."""
    if len(argv) != 3 or argv[1] != "--spawner":
        print("usage: process_shim.py --spawner FD", file=sys.stderr)
        return 2
    if os.fork() > 0:
        os._exit(0)  # detached: the executor never keeps a child, nor reaps one
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)  # a supervisor's output goes to its folder, never to corral
    os.close(devnull)
    return Spawner(socket.socket(fileno=int(argv[2]))).serve()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
