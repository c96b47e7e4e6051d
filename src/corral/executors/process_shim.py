"""The supervisor that the `process` executor puts above every command it runs.

corral may exit, crash or restart while a command runs; this small program stays behind,
so that what became of the command is always written down. It is a standalone script
(run as `python -I process_shim.py <tmp dir> <run dir> <kill grace seconds>`) that
imports only the standard library, so it starts fast and never depends on corral.

What it does, in order:

1. Detaches (forks; the parent exits at once, so the launcher never keeps a child).
2. Claims the launch name: `os.rename(<tmp dir>, <run dir>)`. The rename is atomic, so
   of any number of shims racing for one name exactly one wins; a loser removes its
   tmp dir, answers `exists` and starts nothing.
3. Starts the command in its own process group, output to `stdout.log`/`stderr.log`,
   records `child.pid` (pid, /proc start time, `started_at`) and answers `started`.
4. Waits, enforcing the deadline, a `cancel` request and its own SIGTERM by signalling
   the command's process group: SIGTERM, then SIGKILL after a grace.
5. Writes `exit.json` atomically (tmp file, fsync, rename).

The answer is one line on stdout, which the launcher reads; afterwards stdout and
stderr no longer point at the launcher (stderr goes to `shim.log`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

POLL_SECONDS = 0.05
"""How often the wait loop looks for a cancel request or a passed deadline."""

START_FAILED_EXIT_CODE = 127
"""The exit code recorded when the command cannot even be started (as a shell does)."""


# --- small file helpers ----------------------------------------------------------------


def write_json_atomic(path: Path, data: Any) -> None:
    """Write `data` as JSON so that readers see either nothing or the whole file."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.rename(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file inside `path` survive a power cut."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


def redirect_stderr(path: Path) -> None:
    """Send this shim's own complaints to `path` instead of the launcher's pipe."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 2)
    os.close(fd)


# --- claiming the name -----------------------------------------------------------------


def claim(tmp: Path, final: Path) -> bool:
    """Rename `tmp` to `final`; False (and `tmp` removed) when `final` already exists."""
    me = os.getpid()
    write_json_atomic(tmp / "shim.pid", {"pid": me, "start_time": proc_start_time(me)})
    fsync_dir(tmp)  # the folder's entries are on disk before the name is claimed
    try:
        os.rename(tmp, final)
    except OSError as exc:
        if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        return False
    fsync_dir(final.parent)
    return True


# --- running the command ------------------------------------------------------------------


def start_child(run_dir: Path, launch: dict[str, Any]) -> subprocess.Popen[bytes]:
    """Start the command in its own process group and record its pid and start."""
    spec = launch["spec"]
    # corral's own settings (database URL, ...) are not the job's business.
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env = {**inherited, **spec.get("env", {}), **launch["env"]}
    with (
        open(run_dir / "stdout.log", "ab") as out,
        open(run_dir / "stderr.log", "ab") as err,
    ):
        child = subprocess.Popen(
            spec["command"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=env,
            cwd=launch.get("cwd"),
            process_group=0,
        )
    record = {"pid": child.pid, "start_time": proc_start_time(child.pid), "started_at": now_iso()}
    write_json_atomic(run_dir / "child.pid", record)
    return child


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Send `sig` to the command's whole process group, if any of it is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class Supervision:
    """The wait loop: watches the command and stops it when asked or when time is up."""

    def __init__(
        self,
        child: subprocess.Popen[bytes],
        run_dir: Path,
        launch: dict[str, Any],
        kill_grace: float,
    ) -> None:
        self.child = child
        self.run_dir = run_dir
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
            if self.stop_reason is None and (self.run_dir / "cancel").exists():
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
        cancel = self.run_dir / "cancel"
        if cancel.exists():
            return "cancelled", read_cancel_grace(cancel, self.kill_grace)
        if self.deadline_at is not None and now >= self.deadline_at:
            return "deadline exceeded", self.kill_grace
        return None, 0.0


def read_cancel_grace(path: Path, default: float) -> float:
    """The grace the canceller asked for, from the `cancel` marker file."""
    try:
        return float(json.loads(path.read_text(encoding="utf-8"))["grace_seconds"])
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


def run(run_dir: Path, kill_grace: float) -> None:
    """Start the claimed launch's command, answer the launcher, supervise, record the end."""
    redirect_stderr(run_dir / "shim.log")
    launch = json.loads((run_dir / "launch.json").read_text(encoding="utf-8"))
    try:
        child = start_child(run_dir, launch)
    except (OSError, ValueError) as exc:  # ValueError: e.g. a NUL byte in an argument
        record = exit_record(START_FAILED_EXIT_CODE, None, None)
        record["reason"] = f"could not start the command: {exc}"
        write_json_atomic(run_dir / "exit.json", record)
        announce("started")
        return
    supervision = Supervision(child, run_dir, launch, kill_grace)
    signal.signal(signal.SIGTERM, supervision.on_sigterm)
    started_at = json.loads((run_dir / "child.pid").read_text(encoding="utf-8"))["started_at"]
    announce("started")
    returncode = supervision.wait()
    # Like a container ending: whatever the command left behind in its group goes too.
    signal_group(child.pid, signal.SIGKILL)
    record = exit_record(returncode, supervision.stop_reason, started_at)
    write_json_atomic(run_dir / "exit.json", record)


def main(argv: list[str]) -> int:
    """Entry point: `process_shim.py <tmp dir> <run dir> <kill grace seconds>`."""
    tmp, final, grace = Path(argv[1]), Path(argv[2]), float(argv[3])
    if os.fork() > 0:
        os._exit(0)
    try:
        claimed = claim(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if not claimed:
        announce("exists")
        return 0
    run(final, grace)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
