"""The supervisor that the `process` executor puts above the commands it runs.

corral may exit, crash or restart while a command runs; this small program stays behind,
so that what became of the command is always written down. It is a standalone script
(`python -I process_shim.py --supervisor <fd>`, detached at once into a session of its
own) that imports only the standard library and never depends on corral.

One supervisor serves one executor: it reads launch requests from a Unix socket (the
executor holds the other end), starts each command as its own child, and says on the
socket when each ended, which is how the executor hears of a finished run at once. A
launch costs a process start, as a bare loop over `subprocess.Popen` pays, not a new
interpreter. When the executor's end closes (corral stopped, or died) the supervisor
takes no more launches and goes on until the last of its commands has ended.

What it does for each launch, in order:

1. Claims the launch name: `os.rename(<tmp dir>, <run dir>)`. The rename is atomic, so
   of any number of supervisors racing for one name (two corrals) exactly one wins; a
   loser removes its tmp dir, answers `exists` and starts nothing. The rename is made
   holding the root folder's lock shared (`flock`); a relaunch holds it exclusively
   while it looks for the processes of an earlier copy and kills them, so a launch never
   claims its name between that search finding no folder and the kill.
2. Starts the command in its own process group, output to `stdout.log`/`stderr.log`,
   records `child.pid` (pid, /proc start time, `started_at`) and answers `started`.
   Besides the launch's own environment, the command gets `CORRAL_RUN_DIR`: the run
   folder's absolute path, where it finds its logs, and by which corral finds every
   process of the run (its descendants inherit it); and, when the launch has a payload,
   `CORRAL_PAYLOAD_FILE`: the absolute path of `payload.json` in the run folder, written
   read-only with the folder's other files before the claim.
3. Watches it, enforcing the deadline, a `cancel` request and its own SIGTERM by
   signalling the command's process group: SIGTERM, then SIGKILL after a grace. A run
   folder that disappears is a stop too: once its folder is deleted, or replaced by
   another one under the same path, nothing can observe the run any more and recovery
   may launch the name again, so the command must not go on beside a new copy.
4. Writes `exit.json` atomically (a draft, made durable, then renamed into place), unless
   its folder is gone.

Each claimed folder is held open from before its claim, and every later file is written
relative to that descriptor: a write lands in the folder this supervisor claimed or
fails, never in a new folder that a relaunch made under the same path.

A supervisor killed with SIGKILL leaves its commands running (each in a group of its
own); what they exit with is then unknown, and the executor says so: corral adopts them
while they run, and records `supervisor died` once they are gone.

This file holds the supervisor's loop and each run's watch; the run folder it holds and
writes is process_folder.py's, starting a command process_child.py's, and running a
tenant's command as a stranger process_sandbox.py's. Those are standard library only
too, and, run as a script, this file loads them by their paths (`_sibling`).
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import json
import os
import resource
import selectors
import shutil
import signal
import socket
import sys
import time
import traceback
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any


def _sibling(name: str) -> ModuleType:
    """A module beside this file, by its path: run as a script (`python -I`), this file
    has neither corral nor its own folder on sys.path. It is registered by its bare name,
    which is how process_child.py finds process_folder.py and process_sandbox.py."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # so that a sibling loaded later finds it by its name
    spec.loader.exec_module(module)
    return module


if __package__:
    from corral.executors import process_child, process_folder
    from corral.executors import process_sandbox as sandbox
else:  # pragma: no cover - the supervisor, run as a script
    process_folder = _sibling("process_folder")
    sandbox = _sibling("process_sandbox")
    process_child = _sibling("process_child")  # which uses the two above

POLL_SECONDS = 0.05
"""How often the wait loop looks for a cancel request, a passed deadline or a lost folder."""

START_FAILED = "could not start the command"
"""Why a command that cannot start (no such program, a bad folder) failed: for good."""

NO_RESOURCES = "no resources to start the command"
"""Why a command failed to start for want of descriptors, processes or memory: transient."""

_SHORT_OF = frozenset({errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.ENOMEM})

START_FAILED_EXIT_CODE = 127
"""The exit code recorded when the command cannot even be started (as a shell does)."""


FOLDER_GONE = "run folder removed"
"""Why a command was stopped whose run folder was deleted or replaced (never recorded:
there is no folder left to record it in)."""


# --- the supervisor's own record -------------------------------------------------------


def supervisor_record() -> bytes:
    """`shim.pid`: this process, as a record that tells it from a later one with its pid."""
    me = os.getpid()
    return json.dumps({"pid": me, "start_time": process_child.proc_start_time(me)}).encode()


# --- running the command ------------------------------------------------------------------


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Send `sig` to the command's whole process group, if any of it is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class Supervision:
    """One command the supervisor watches: it stops the command when asked or when time is
    up, and records its end."""

    def __init__(
        self,
        ask: int,
        pid: int,
        started: dict[str, Any],
        folder: process_folder.RunFolder,
        launch: dict[str, Any],
        kill_grace: float,
    ) -> None:
        self.ask = ask  # the id of the launch request it answered
        self.log_bytes = int(launch.get("log_bytes", process_folder.LOG_BYTES))
        self.pid = pid  # the command's, and its process group's
        self.started = started
        self.folder = folder
        self.kill_grace = kill_grace
        deadline = launch.get("deadline_seconds")
        self.deadline_at = None if deadline is None else time.monotonic() + float(deadline)
        self.stop_reason: str | None = None
        self.kill_at: float | None = None
        self.drafted: dict[str, Any] | None = None  # exit.json, drafted
        self.record: dict[str, Any] | None = None  # exit.json, once in place
        self.uid: int | None = started.get("uid")  # a stranger's own, freed when it ends
        self.lease: int | None = None  # the uid's lease, held until its leftovers are gone
        self.sandboxed = bool(started.get("sandboxed"))

    def tick(self, now: float, terminated: bool) -> None:
        """One look: start stopping the command, or force it once the grace is over."""
        if self.stop_reason is None:
            self.stop_reason, grace = self.stop_request(now, terminated)
            if self.stop_reason is not None:
                sandbox.signal_run(self.pid, signal.SIGTERM, sandboxed=self.sandboxed)
                self.kill_at = now + grace
        elif self.kill_at is not None and now >= self.kill_at:
            signal_group(self.pid, signal.SIGKILL)
            self.kill_at = None

    def stop_request(self, now: float, terminated: bool) -> tuple[str | None, float]:
        """Why the command must stop now, and the grace it gets; (None, 0) to keep going."""
        if terminated:
            return "supervisor terminated", self.kill_grace
        if not self.folder.still_mine():
            return FOLDER_GONE, self.kill_grace
        if self.folder.exists("cancel"):
            return "cancelled", process_folder.read_cancel_grace(self.folder, self.kill_grace)
        if self.deadline_at is not None and now >= self.deadline_at:
            return "deadline exceeded", self.kill_grace
        return None, 0.0

    def end(self, returncode: int) -> bool:
        """The command ended with `returncode`: draft its record (False if the folder is no
        longer this run's: nothing to record)."""
        # The canceller signals the group itself: the command may end before we look.
        if self.stop_reason is None and self.folder.exists("cancel"):
            self.stop_reason = "cancelled"
        # Like a container ending: whatever the command left behind in its group goes too,
        # and a stranger's every process (its uid is then free for another attempt).
        signal_group(self.pid, signal.SIGKILL)
        if self.uid is not None:
            sandbox.clean_up_uid(self.uid)
            with contextlib.suppress(OSError):  # the folder: root's alone, for a later owner
                os.fchown(self.folder.fd, 0, 0)  # of the uid must not read it
                os.fchmod(self.folder.fd, 0o700)
        if not self.folder.still_mine():
            return False
        record = process_folder.exit_record(
            returncode, self.stop_reason, self.started["started_at"]
        )
        try:
            self.folder.write_json_draft("exit.json", record)
        except FileNotFoundError:  # deleted since we looked
            return False
        self.drafted = record
        return True

    def recorded(self) -> None:
        """Put the drafted record in place (it is durable now) and move the run to the
        index of ended ones, unless the folder went."""
        if self.folder.still_mine():
            try:
                self.folder.commit_draft("exit.json")
            except FileNotFoundError:
                return
            self.record = self.drafted
            path = self.folder.path
            process_folder.mark_ended(path.parent, path.name, time.time())


class Supervisor:
    """The one supervisor of an executor's runs: it claims and starts each launch asked on
    `sock`, watches every command it started, records each end, and says so on `sock`.

    A round of its loop first writes what it has to (the files of new run folders, the exit
    records of ended commands) under draft names, makes them all durable with one sync of
    the filesystem, and only then claims the new folders, starts their commands and puts
    the records in place: a power cut never leaves a torn file, and a sync costs a round,
    not a file. (A rename lost to a power cut reads as a launch that never was, or a
    supervisor that died: recovery's cases, and no process outlives a power cut.)

    It reads the socket until the executor closes its end (corral stopped, or died), and
    goes on until the last of its commands has ended. SIGTERM closes the socket (the
    executor starts another supervisor for what comes next), stops every command
    (SIGTERM, then SIGKILL after its grace), records each as `supervisor terminated`, and
    ends with the last of them."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.listening = True
        self.terminated = False
        self.runs: dict[int, Supervision] = {}  # by the command's pid
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)
        self.pending = b""
        self.outbox: list[dict[str, Any]] = []  # said at the end of the round
        self.unsynced: set[Path] = set()  # roots whose filesystem has drafts to sync (the
        # files of `made`, the records of `ended`, and the claims since the last sync)
        self.made: list[
            tuple[dict[str, Any], process_folder.RunFolder]
        ] = []  # new folders, to claim
        self.record = supervisor_record()  # shim.pid, the same in every folder
        self.ended: list[Supervision] = []  # ended runs, their records drafted

    def serve(self) -> int:
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes the select
        signal.signal(signal.SIGTERM, self.on_sigterm)
        signal.set_wakeup_fd(self.wake_w)
        with selectors.DefaultSelector() as selector:
            selector.register(self.sock, selectors.EVENT_READ)
            selector.register(self.wake_r, selectors.EVENT_READ)
            self.say({"supervisor": os.getpid()})
            next_look = time.monotonic()
            while self.listening or self.runs:
                for key, _ in selector.select(POLL_SECONDS if self.runs else None):
                    if key.fileobj is self.sock:
                        self.hear(selector)
                    else:
                        with contextlib.suppress(BlockingIOError):
                            os.read(self.wake_r, 4096)
                self.reap()
                self.flush()
                if self.terminated and self.listening:
                    self.stop_listening(selector)
                if (now := time.monotonic()) >= next_look:
                    for run in list(self.runs.values()):
                        try:
                            run.tick(now, self.terminated)
                        except Exception:  # one folder's trouble: never the others'
                            traceback.print_exc()
                    next_look = now + POLL_SECONDS
        return 0

    def on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        """Someone stopped the supervisor itself (a shutdown): stop every command, then
        record each."""
        self.terminated = True

    def hear(self, selector: selectors.BaseSelector) -> None:
        try:
            data = self.sock.recv(65536)
        except OSError:  # ECONNRESET: it died with our news unread
            data = b""
        if not data:  # the executor is gone: no more launches, the runs go on
            self.stop_listening(selector)
            return
        self.pending += data
        *lines, self.pending = self.pending.split(b"\n")
        requests = []
        for line in lines:
            try:
                requests.append(json.loads(line))
            except ValueError:
                traceback.print_exc()  # not the executor's: nobody to answer
        for request in requests:
            if folder := self.prepare(request):
                self.made.append((request, folder))
                self.unsynced.add(folder.path.parent)

    def stop_listening(self, selector: selectors.BaseSelector) -> None:
        """No more launches: the executor sees its socket end (and, if it lives on, starts
        another supervisor); the runs here go on until they end."""
        self.flush()  # what was asked so far is answered first
        self.listening = False
        with contextlib.suppress(KeyError, ValueError):
            selector.unregister(self.sock)
        self.sock.close()

    def answer(self, request: dict[str, Any], how: Any) -> Any:
        """`how()`'s answer to `request`, or the error it raised: never fatal, the other
        runs go on."""
        try:
            said = how()
        except Exception as exc:
            self.fail(request, exc)
            return None
        if isinstance(said, dict):
            self.outbox.append({"id": request["id"], **said})
        return said

    def fail(self, request: dict[str, Any], exc: Exception) -> None:
        """Answer `request` with the error `exc`."""
        error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        self.outbox.append({"id": request["id"], "error": error})

    def prepare(self, request: dict[str, Any]) -> process_folder.RunFolder | None:
        """The launch's folder, made in HALF_MADE with its files written, and held; None
        when it is answered already (the name exists, the supervisor is stopping, or it
        failed)."""

        def make() -> process_folder.RunFolder | dict[str, Any]:
            final = Path(request["run"])
            if self.terminated:
                return {"error": "the supervisor is stopping (SIGTERM)"}
            if os.path.lexists(final):
                return {"answer": "exists"}
            tmp = process_folder.make_half(final)
            try:
                folder = process_folder.RunFolder(tmp)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            try:
                files = request["files"]
                launch = json.dumps(files["launch.json"]).encode()
                os.close(folder.write("launch.json", launch, mode=0o600))  # corral's alone
                os.close(folder.write("labels.json", json.dumps(files["labels.json"]).encode()))
                os.close(folder.write("shim.pid", self.record))
                payload = files.get(process_child.PAYLOAD_FILE)
                if payload is not None:  # JSON text already: written as it is, read-only
                    name = process_child.PAYLOAD_FILE
                    os.close(folder.write(name, payload.encode(), mode=0o444))
                process_folder.mark_live(final.parent, final.name)
            except BaseException:
                os.close(folder.fd)
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            return folder

        made = self.answer(request, make)
        return made if isinstance(made, process_folder.RunFolder) else None

    def claim_all(
        self, made: list[tuple[dict[str, Any], process_folder.RunFolder]]
    ) -> list[process_folder.RunFolder | None]:
        """Claim the names of a round's new folders, holding each root's lock once for all
        of its claims: each folder, or None where the launch is answered already (`exists`,
        or its error)."""
        claimed: list[process_folder.RunFolder | None] = [None] * len(made)
        by_root: dict[Path, list[int]] = {}
        for i, (request, _) in enumerate(made):
            by_root.setdefault(Path(request["run"]).parent, []).append(i)
        for root, batch in by_root.items():
            with contextlib.ExitStack() as locked:
                try:
                    locked.enter_context(process_folder.claims_lock(root))
                except OSError as exc:  # the root gone: nothing to claim there
                    for i in batch:
                        request, folder = made[i]
                        self.fail(request, exc)
                        os.close(folder.fd)
                        shutil.rmtree(folder.path, ignore_errors=True)
                    continue
                for i in batch:
                    request, folder = made[i]
                    if self.answer(request, lambda r=request, f=folder: self.claim(r, f)):
                        claimed[i] = folder
        return claimed

    def claim(self, request: dict[str, Any], folder: process_folder.RunFolder) -> bool:
        """Claim the launch's name (the caller holds the lock): False, answered `exists`,
        when another launch has it."""
        final = Path(request["run"])
        try:
            won = process_folder.claim(folder, final)
        except BaseException:
            os.close(folder.fd)
            shutil.rmtree(folder.path, ignore_errors=True)
            raise
        if not won:
            os.close(folder.fd)
            self.outbox.append({"id": request["id"], "answer": "exists"})
            return False
        self.unsynced.add(final.parent)  # the rename, durable with the next round
        return True

    def launch(self, folder: process_folder.RunFolder, request: dict[str, Any]) -> dict[str, Any]:
        """Start the claimed launch's command: what to answer. One that cannot start ends
        at once, its exit recorded (`could not start the command`)."""
        grace = float(request["grace"])
        launch = request["files"]["launch.json"]
        uid = lease = None
        try:
            if (stranger := launch.get("stranger")) and (uids := stranger.get("uids")):
                taken = {run.uid for run in self.runs.values() if run.uid is not None}
                leases = folder.path.parent / sandbox.UIDS
                uid, lease = sandbox.pick_uid(uids[0], uids[1], taken, leases)
            payload = process_child.PAYLOAD_FILE in request["files"]
            pid, started = process_child.start_child(folder, launch, payload=payload, uid=uid)
        except Exception as exc:  # ValueError: e.g. a NUL byte in an argument
            if lease is not None:
                os.close(lease)
            short = isinstance(exc, OSError) and exc.errno in _SHORT_OF
            why = NO_RESOURCES if short else START_FAILED
            record = process_folder.exit_record(START_FAILED_EXIT_CODE, None, None)
            record["reason"] = f"{why}: {exc}"
            said: dict[str, Any] = {"answer": "started", "ended": True}
            try:
                if process_folder.record_exit(folder, record):
                    said["exit"] = record
            except OSError:
                traceback.print_exc()
                said["unrecorded"] = True
            finally:
                os.close(folder.fd)
            return said
        run = self.runs[pid] = Supervision(request["id"], pid, started, folder, launch, grace)
        run.lease = lease
        return {"answer": "started"}

    def reap(self) -> None:
        while self.runs:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            run = self.runs.pop(pid, None)
            if run is None:
                continue
            try:
                if run.end(os.waitstatus_to_exitcode(status)):
                    self.ended.append(run)
                    self.unsynced.add(run.folder.path.parent)
                    continue
            except Exception:  # this run's record failed (a disk error): never the others'
                traceback.print_exc()
                self.done(run, recorded=False)
                continue
            self.done(run)

    def done(self, run: Supervision, *, recorded: bool = True) -> None:
        if run.lease is not None:  # its uid is clean now: another attempt may have it
            os.close(run.lease)
            run.lease = None
        said: dict[str, Any] = {"id": run.ask, "ended": True}
        if not recorded:  # the executor reports it failed: its folder will never say
            said["unrecorded"] = True
        elif run.record is not None:  # what its folder says now: no need to read it
            said["exit"] = run.record
            said["output"] = process_folder.output_tails(run.folder, run.log_bytes)
        with contextlib.suppress(OSError):
            os.close(run.folder.fd)
        self.outbox.append(said)

    def flush(self) -> None:
        """The round's second half: one sync for what it drafted (and for the claims since
        the last one), then the records put in place, the new folders claimed and their
        commands started, and all of it said."""
        if self.made or self.ended:
            for root in self.unsynced:
                with contextlib.suppress(OSError):  # a root gone: nothing there to keep
                    process_folder.sync_filesystem(root)
            self.unsynced.clear()
            made, ended = self.made, self.ended
            self.made, self.ended = [], []
            self.put_in_place(made, ended)
        outbox, self.outbox = self.outbox, []
        self.say(*outbox)

    def put_in_place(
        self, made: list[tuple[dict[str, Any], process_folder.RunFolder]], ended: list[Supervision]
    ) -> None:
        """What a sync made durable: the exit records renamed into place, the new folders
        claimed and their commands started."""
        for run in ended:
            try:
                run.recorded()
            except Exception:
                traceback.print_exc()
                self.done(run, recorded=False)
                continue
            self.done(run)
        for (request, _), folder in zip(made, self.claim_all(made), strict=True):
            if folder is not None:
                self.answer(request, lambda r=request, f=folder: self.launch(f, r))

    def say(self, *messages: dict[str, Any]) -> None:
        """A line each to the executor, if it still listens (it reads as it goes)."""
        if not self.listening or not messages:
            return
        try:
            self.sock.sendall(b"".join(json.dumps(m).encode() + b"\n" for m in messages))
        except OSError:  # gone: nobody to tell; the run folders say it all
            self.listening = False


def main(argv: list[str]) -> int:
    """Entry point: `process_shim.py --supervisor <fd of a Unix stream socket> [log file]`."""
    if len(argv) not in (3, 4) or argv[1] != "--supervisor":
        print("usage: process_shim.py --supervisor FD [LOG FILE]", file=sys.stderr)
        return 2
    if os.fork() > 0:
        os._exit(0)  # detached: the executor never keeps a child, nor reaps one
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)  # a command's output goes to its folder, never to corral
    os.close(devnull)
    if len(argv) > 3:  # its own complaints: never corral's stderr, which may close
        log = os.open(argv[3], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(log, 2)
        os.close(log)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):  # a folder held open for each live run
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    os.set_inheritable(int(argv[2]), False)  # the executor's socket: never a command's
    return Supervisor(socket.socket(fileno=int(argv[2]))).serve()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
