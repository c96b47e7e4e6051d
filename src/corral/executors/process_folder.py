"""A run folder of the `process` executor as its supervisor holds and writes it: opened
once and written relative to that descriptor (`RunFolder`), claimed by one atomic rename
under the root's lock, indexed as live or ended, and its exit record and output tails.
Standard library only: the supervisor (process_shim.py, run as a script) loads this file
by its path, as it loads process_sandbox.py.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import errno
import fcntl
import json
import os
import shutil
import signal
import stat
import tempfile
import time
import traceback
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

LIVE = ".live"
"""The index of runs that may still go on: `<root>/.live/<name>`, an empty file named after
the run folder, made before the name is claimed and moved to ENDED once its exit is recorded."""

ENDED = ".ended"
"""The index of ended runs by the UTC hour they ended in: `<root>/.ended/<YYYYMMDDHH>/<name>`,
so that forgetting old runs reads old hours only. Both indexes are hints, rebuilt from the
run folders when missing: a run folder is the truth about its run."""

HALF_MADE = ".tmp"
"""Where a launch's folder is made (`<root>/.tmp/<name>-*`) before its claim renames it."""
LOGS = ("stdout.log", "stderr.log")
"""Where the command's output goes, in its run folder."""
LOG_BYTES = 65_536
"""How much of the end of each log the run log keeps, unless the launch says."""


class RunFolder:
    """A folder held by a descriptor: its files are read and written relative to it, so they
    land in this very folder (or fail once it is deleted), whatever is at its path since."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
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
        except OSError:  # absent, or cannot tell (EIO...): never stop a command on a doubt
            return False
        return True

    def read_json(self, name: str) -> Any:
        """The JSON in this folder's file `name`."""
        with open(self.open(name, os.O_RDONLY), encoding="utf-8") as fh:
            return json.load(fh)

    def write(self, name: str, data: bytes, *, mode: int = 0o644) -> int:
        """A new file `name` in this folder holding `data`; its descriptor, open (for an
        fsync), which the caller closes."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        fd = os.open(name, flags, mode, dir_fd=self.fd)
        try:
            if mode != 0o644:
                os.fchmod(fd, mode)  # whatever the umask
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except BaseException:
            os.close(fd)
            raise
        return fd

    def write_json_draft(self, name: str, data: Any) -> None:
        """Write `data` as JSON under a draft name, for `commit_draft` to put in place once
        it is durable (sync_filesystem): a batch of them costs one sync, and a power cut
        never leaves a torn file under `name`."""
        os.close(self.write(f".{name}.tmp", json.dumps(data).encode()))

    def commit_draft(self, name: str) -> None:
        os.rename(f".{name}.tmp", name, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def write_json_atomic(self, name: str, data: Any, *, durable: bool = True) -> None:
        """Write `data` as JSON so that readers see either nothing or the whole file, and,
        if `durable`, so that it survives a power cut. `child.pid` need not: after a power
        cut no process it names runs, and the executor reads a damaged one as none."""
        tmp = f".{name}.tmp"
        fd = self.write(tmp, json.dumps(data).encode())
        try:
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        if durable:
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


def _syncfs() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None


SYNCFS = _syncfs()


def sync_filesystem(path: Path) -> None:
    """Make everything written on `path`'s filesystem survive a power cut: one call for a
    batch of files and renames, instead of an fsync of each file and of its folder."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if SYNCFS is None or SYNCFS(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


def hour_of(at: float) -> str:
    """The ENDED folder of a run that ended at `at` (seconds since the epoch)."""
    return time.strftime("%Y%m%d%H", time.gmtime(at))


def mark_live(root: Path, name: str) -> None:
    """Put `name` in the index of live runs (before its claim, so no run ever goes on
    unindexed)."""
    for _ in range(2):
        try:
            _make_marker(f"{root}/{LIVE}/{name}")
            return
        except FileNotFoundError:
            os.makedirs(f"{root}/{LIVE}", mode=0o700, exist_ok=True)


def _make_marker(path: str) -> None:
    """An empty file at `path`, made with one system call (there is one for every run)."""
    with contextlib.suppress(FileExistsError):
        os.mknod(path, 0o644 | stat.S_IFREG)


def mark_ended(root: Path, name: str, at: float) -> None:
    """Move `name` from the index of live runs to the runs that ended in `at`'s hour. Never
    fails the run: its exit is recorded, and a marker left behind is moved by the executor
    when it finds the run ended."""
    try:
        _mark_ended(root, name, at)
    except OSError:
        traceback.print_exc()


def _mark_ended(root: Path, name: str, at: float) -> None:
    live, hour = f"{root}/{LIVE}/{name}", f"{root}/{ENDED}/{hour_of(at)}"
    for _ in range(4):  # an empty old hour may be removed under us: make it again
        try:
            os.rename(live, f"{hour}/{name}")
            return
        except FileNotFoundError:
            if not os.path.isdir(hour):
                os.makedirs(hour, exist_ok=True)
                continue
        try:  # never in the live index (a crash, an earlier version): only in this one
            _make_marker(f"{hour}/{name}")
            return
        except FileNotFoundError:
            continue


def make_half(final: Path) -> Path:
    """A new folder in the root's HALF_MADE, for a launch of `final` to fill and claim."""
    half = final.parent / HALF_MADE
    try:
        return Path(tempfile.mkdtemp(prefix=f"{final.name}-", dir=half))
    except FileNotFoundError:
        half.mkdir(exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f"{final.name}-", dir=half))


def claim(folder: RunFolder, final: Path) -> bool:
    """Rename `folder` (made in HALF_MADE, its files written and synced) to `final`, holding
    the root's claims_lock; False (and the folder removed) when `final` exists. A rename lost
    to a power cut reads as a launch that never was: recovery's case.

    The folder was opened before the rename, so its descriptor is the claimed folder
    itself: opening `final` afterwards could already find another one there."""
    try:
        os.rename(folder.path, final)
    except OSError as exc:
        if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise
        shutil.rmtree(folder.path, ignore_errors=True)
        return False
    folder.path = final
    return True


def output_tails(folder: RunFolder, limit: int) -> dict[str, Any]:
    """The last `limit` bytes of each log the command wrote (none for an empty one), with
    its size, for the run log: {"stdout": {"bytes": N, "tail": text}, ...}; a tail that is
    not UTF-8 as it is goes in base64 (`"base64": true`), and the executor decodes it."""
    out = {}
    for name in LOGS:
        try:  # a stat first: most commands leave a log empty, and opening costs more
            size = os.stat(name, dir_fd=folder.fd).st_size
            if not size:
                continue
            fd = folder.open(name, os.O_RDONLY)
        except OSError:
            continue
        try:
            data = os.pread(fd, min(size, limit), max(size - limit, 0))
        except OSError:
            continue
        finally:
            os.close(fd)
        if data:
            said: dict[str, Any] = {"bytes": size}
            try:
                said["tail"] = data.decode()
            except UnicodeDecodeError:  # cut in a character, or not text: as it is
                said |= {"tail": base64.b64encode(data).decode(), "base64": True}
            out[name.removesuffix(".log")] = said
    return out


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


def record_exit(folder: RunFolder, record: dict[str, Any]) -> bool:
    """Write `exit.json` at once and durably (a command that never started: the ends of
    the others are drafted and synced by the round), and move the run to the index of
    ended ones, unless the folder is gone (False): nobody may read it, and a relaunch may
    have made a new folder under its path since."""
    if not folder.still_mine():
        return False
    try:
        folder.write_json_atomic("exit.json", record)
    except FileNotFoundError:  # deleted since we looked
        return False
    mark_ended(folder.path.parent, folder.path.name, time.time())
    return True


def now_iso() -> str:
    """The current UTC time as an ISO 8601 string."""
    return datetime.now(UTC).isoformat()
