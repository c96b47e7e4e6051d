"""The `process` executor: corral's embedded default, a tiny Kubernetes on one machine.

It exists so that corral runs jobs with nothing but a folder: no cluster, no daemon.
Each launch name is a run folder under `root`; the folder is the whole truth about the
launch, so a new corral (or another one beside it) rebuilds everything from it.

    <root>/<launch name>/
        launch.json   name, labels, spec, env, deadline, cwd (written before the claim)
        labels.json   the launch's labels, for `observe` and `list_managed`
        payload.json  the job's payload as JSON, read-only (0444); only when it has one
        shim.pid      the supervisor's pid and /proc start time (guards against pid reuse)
        child.pid     the command's pid, /proc start time and `started_at`
        stdout.log    the command's output
        stderr.log
        cancel        present once a cancel was asked for (holds the grace)
        exit.json     exit code, reason, start and end: present once it finished
    <root>/.live/<launch name>                  runs that may still go on
    <root>/.ended/<YYYYMMDDHH>/<launch name>    runs that ended, by the UTC hour they ended
    <root>/.tmp/<launch name>-*                 folders made for a launch, not yet claimed

The two indexes are empty files named after run folders, so that the reconciler's pass reads the
runs that go on (for orphans) and those that ended longer ago than the retention (to
forget them), never the whole history: its time and corral's memory stay flat however
many finished runs the root keeps. They are hints: a run folder is the truth about its
run, a marker found stale is moved, and missing indexes are rebuilt from the folders.

The folder is made under `.tmp/` and claimed by the supervisor (the shim,
process_shim.py) with one atomic rename, so a name is launched at most once, even by two
corrals at the same moment. Each executor has one supervisor, started at its first launch
(and again if it dies), in a session of its own, so commands outlive corral; it starts
every command as its own child, so a launch costs a process start and no interpreter,
and it says at once when a command has ended, which is how `events` hears of finished
runs without polling their folders. Liveness is read from /proc, so this executor needs
Linux.

Besides the launch's environment (`CORRAL_JOB_ID`, `CORRAL_FENCE`, ...), every command
gets `CORRAL_RUN_DIR`, the absolute path of its run folder (its logs are there), which
its descendants inherit, and a command whose job has a payload gets `CORRAL_PAYLOAD_FILE`,
the absolute path of its `payload.json`. A job whose payload is null gets neither the file
nor the variable (most jobs have none: no file to write, sync and forget for them); the
file is written with launch.json, before the claim, and made durable by the same sync.

A run folder that is deleted (or replaced by another under the same path) while its
command runs ends the run: the shim stops the command and writes nothing more (it writes
only through the folder it claimed, never into a new one).

A relaunch (`Launch.relaunch`) finds no run folder when the first launch never got
through, but also when the folder was deleted while its run went on: its shim stops the
command, unless the shim was killed too and left the command orphaned. So before it
starts a new copy, a relaunch finds every live process of the run in /proc: commands by
`CORRAL_RUN_DIR=<run folder>` in their environment (the launch name alone could belong
to another corral on this machine), and a shim of an earlier version of this executor
(one per run) by its arguments; a supervisor that serves other runs too is left alone,
as it stops a command whose folder went by itself. It SIGKILLs them and
waits until they are gone; if one survives, the launch fails and recovery tries again
later. The scan costs a few milliseconds, which is why only a relaunch makes it. The
first launch of the name may still be under way when recovery relaunches it (a slow
machine, past launch_grace): the search and the kill hold the root's lock exclusively
and every claim is made holding it shared, so the search either sees the folder (and
stops nothing: that is the launch) or finds no process, and the first launch then claims
the name and the relaunch finds it launched (the rename lets exactly one through).

A supervisor's own complaints go to `.<root name>-supervisor.log` beside the root.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import dataclasses
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncGenerator, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple

from corral import clock, errors, launching, model
from corral.executors import base, process_sandbox, process_shim

log = logging.getLogger("corral.executors.process")

KIND = "process"
SHIM = Path(__file__).with_name("process_shim.py")
KILL_GRACE_SECONDS = 10.0
"""By default, how long a command gets between SIGTERM and SIGKILL when its deadline passes."""
SHIM_ANSWER_SECONDS = 30.0
"""How long `launch` waits for the shim to say `started` or `exists`."""
SWEEP_EVERY = 10
"""`events` looks at every run it watches once in this many poll intervals, besides the
runs the supervisor says ended: a command whose supervisor was killed ends unannounced."""
SUPERVISOR_DIED = "supervisor died before recording an exit"
UNRECORDED = "its supervisor could not record its exit"
FORGET_BATCH = 1000
"""At most this many old finished runs are offered for forgetting in one reconciler pass, so
that the pass after a long outage costs no more than any other."""
INDEXED = ".indexed"
"""Present once the root's indexes hold every run folder (made by `start` when missing)."""
STOP_WAIT_SECONDS = 5.0
"""At least this long (else the kill grace) a relaunch waits for an earlier copy to die."""

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
_SPEC_FIELDS = ("command", "cwd", "env")


class ProcessExecutor:
    """Runs each launch as a local process, supervised by a detached shim."""

    kind = KIND

    def __init__(
        self,
        *,
        root: Path,
        clock: clock.Clock,
        poll_interval: float = 0.1,
        kill_grace: float = KILL_GRACE_SECONDS,
        retention: timedelta | None = None,
        log_bytes: int = launching.STREAM_BYTES,
        strangers: Mapping[str, Any] | None = None,
        state_dir: Path | None = None,
    ) -> None:
        self.root = Path(root).absolute()  # fixed now: a later chdir must not move it
        self._strangers = dict(strangers) if strangers else None
        """How tenants' commands run (process_sandbox): `uids` [first, last], `sandbox`,
        `hide` (corral's paths a sandbox must not show), `shown` (paths it must)."""
        self._state_dir = None if state_dir is None else Path(state_dir).absolute()
        self._clock = clock
        self._poll_interval = poll_interval
        self._kill_grace = kill_grace
        self._log_bytes = log_bytes
        self.retention = retention or timedelta(days=7)
        self._watched: dict[str, Mapping[str, str]] = {}  # launched here, to their ends: labels
        self._asking: collections.Counter[str] = collections.Counter()  # launches in flight
        self._closed = False
        self._supervisor = _Supervisor()
        self._log = self.root.with_name(f".{self.root.name}-supervisor.log")
        self._absent_before: set[str] = set()  # live markers with no folder, last look
        self._forget_after: tuple[str, str] = ("", "")  # where the last offer stopped
        self._offered: dict[str, Path] = {}  # old ended markers offered, by name

    # --- spec ------------------------------------------------------------------------------

    def validate_spec(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """The spec `{"command": [...], "env": {...}, "cwd": "..."}`, normalised."""
        if not isinstance(spec, Mapping):
            raise errors.InvalidInput(base.spec_error(KIND, "spec", "must be a JSON object"))
        unknown = sorted(set(spec) - set(_SPEC_FIELDS))
        if unknown:
            allowed = ", ".join(_SPEC_FIELDS)
            raise errors.InvalidInput(
                base.spec_error(KIND, unknown[0], f"unknown field (allowed: {allowed})")
            )
        normal: dict[str, Any] = {"command": _checked_command(spec.get("command"))}
        if "env" in spec:
            normal["env"] = _checked_env(spec["env"])
        if "cwd" in spec:
            normal["cwd"] = _checked_cwd(spec["cwd"])
        return normal

    # --- life ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Create the root folder, and its indexes from the run folders if they are missing."""
        await asyncio.to_thread(self._make_root)
        log.info("process executor: run folders in %s", self.root)
        if self._strangers is not None:
            await asyncio.to_thread(self._ready_for_strangers)
        if not (self.root / INDEXED).exists():
            await asyncio.to_thread(self._rebuild_index)

    @property
    def supervisor_pid(self) -> int | None:
        """The pid of this executor's supervisor, once it runs."""
        return self._supervisor.pid

    async def close(self) -> None:
        """Stop `events`; the supervisor takes no more launches. Running commands keep
        running under it."""
        self._closed = True
        await self._supervisor.close()

    # --- the protocol --------------------------------------------------------------------

    async def launch(self, launch: launching.Launch) -> None:
        """Claim `launch.name` and start its command; idempotent by name and identity."""
        if self._closed:
            raise errors.ExecutorError("process executor: closed; no more launches")
        spec = self.validate_spec(launch.spec)
        run_dir = self._run_dir(launch.name)
        if launch.stranger and self._strangers is None:
            raise errors.ConfigError(
                f"process executor: tenant {launch.tenant!r} is granted 'process', but its"
                " commands cannot run as strangers here: set executors.process.uid_range or"
                " executors.process.sandbox"
            )
        if launch.relaunch:
            await self._stop_earlier_copies(run_dir)
        watched = launch.name in self._watched
        # Before the request: its end may come with the answer.
        self._watched[launch.name] = launch.labels
        self._asking[launch.name] += 1
        try:
            # Recovery asks again for launches it finds (before it adopts them): a claimed
            # name is one the supervisor would answer `exists` for, so no request is made
            # (nor a supervisor started). A first launch does not look: it is rarely there.
            claimed = launch.relaunch and await asyncio.to_thread(os.path.lexists, run_dir)
            if not claimed:
                files = _launch_files(launch, spec, self._log_bytes)
                if launch.stranger:
                    files["launch.json"]["stranger"] = self._strangers
                answer = await self._supervisor.supervise(
                    run_dir, files, self._kill_grace, self._clock, log=self._log
                )
                claimed = answer == "exists"
            if claimed:
                await asyncio.to_thread(_check_same_identity, run_dir, launch)
        except BaseException:
            if not watched:
                self._watched.pop(launch.name, None)
            raise
        finally:
            self._asking[launch.name] -= 1
            if self._asking[launch.name] <= 0:
                del self._asking[launch.name]

    async def _stop_earlier_copies(self, run_dir: Path) -> None:
        """SIGKILL every process still running for `run_dir` while the folder is missing, and
        wait until none is left; ExecutorError if one outlives the wait, so that recovery
        tries again later instead of starting a second copy beside it."""
        run = run_dir.name
        until = self._clock.monotonic() + max(self._kill_grace, STOP_WAIT_SECONDS)
        stopped: set[_Process] = set()
        while found := await asyncio.to_thread(_stop_processes_of_run, run_dir):
            for proc in sorted(found - stopped):
                role = "command" if proc.is_command else "supervisor"
                log.warning("%s: stopped pid %d, the %s of an earlier launch", run, proc.pid, role)
            stopped |= found
            if self._clock.monotonic() >= until:
                pids = ", ".join(str(p.pid) for p in sorted(found))
                raise errors.ExecutorError(
                    f"process executor: earlier processes of {run!r} (pid {pids})"
                    " outlived SIGKILL; not relaunching it beside them"
                )
            await self._clock.sleep(self._poll_interval)

    async def observe(self, names: Sequence[str]) -> dict[str, launching.Observation]:
        """What each name's run folder shows."""
        dirs = {name: self._run_dir(name) for name in names}
        return await asyncio.to_thread(self._observe_blocking, dirs)

    async def list_managed(self, selector: Mapping[str, str]) -> list[launching.Observation]:
        """Observations of every run folder whose labels include all of `selector`: the
        whole history, so the reconciler asks `list_live` and `list_ended` instead."""
        return await asyncio.to_thread(self._list_blocking, dict(selector))

    async def list_live(self, selector: Mapping[str, str]) -> list[launching.Observation]:
        """Observations of the runs in the live index whose labels include all of
        `selector` and that may still go on; what it finds ended moves to the ended index."""
        return await asyncio.to_thread(self._live_blocking, dict(selector))

    async def list_ended(self, before: datetime) -> list[launching.Observation]:
        """Observations of up to FORGET_BATCH runs that ended before `before`, from the
        ended index's hours before it (and an offer after the last one, pass by pass)."""
        return await asyncio.to_thread(self._ended_blocking, before)

    async def cancel(self, name: str, grace: timedelta) -> None:
        """Ask the command to stop (SIGTERM to its group), then SIGKILL it after `grace`."""
        run_dir = self._run_dir(name)
        seconds = max(grace.total_seconds(), 0.0)
        if not await asyncio.to_thread(_cancel_begin, run_dir, seconds):
            return
        until = self._clock.monotonic() + seconds
        while (left := until - self._clock.monotonic()) > 0:
            if await asyncio.to_thread(_has_exit, run_dir):
                return
            await self._clock.sleep(min(self._poll_interval, left))
        await asyncio.to_thread(_signal_child_group, run_dir, signal.SIGKILL)

    async def events(self) -> AsyncGenerator[launching.Observation, None]:
        """Yields, once each, the finish of launches made by this instance, until `close`:
        as soon as the supervisor says a command ended, and for every run watched once in
        SWEEP_EVERY poll intervals (a command whose supervisor was killed ends unannounced)."""
        sweep_every = SWEEP_EVERY * self._poll_interval  # by the clock: not by the news
        next_sweep = self._clock.monotonic() + sweep_every
        while not self._closed:
            ended = self._supervisor.take_ended()
            names = ended.keys() & self._watched.keys()
            if self._clock.monotonic() >= next_sweep:
                next_sweep = self._clock.monotonic() + sweep_every
                names = set(self._watched)
            if names:
                # A success the supervisor told (its record is in place, as it says) needs
                # no look at its folder; the rest are read from their folders.
                seen = {
                    name: _from_record(name, self._run_dir(name), self._watched[name], record)
                    for name in names
                    if (record := ended.get(name)) is not None
                    and record.get("succeeded")
                    and "output" in record
                }
                if unread := sorted(names - seen.keys()):
                    seen |= await self.observe(unread)
                for name in self._supervisor.take_unrecorded() & names:
                    if (obs := seen.get(name)) is not None and not obs.phase.finished:
                        seen[name] = dataclasses.replace(
                            obs,
                            phase=launching.Phase.FAILED,
                            reason=UNRECORDED,
                            failure_class=model.FailureClass.TRANSIENT,
                        )
                for name in sorted(names):
                    obs = seen.get(name)
                    if obs is None or not (
                        obs.phase.finished or obs.phase is launching.Phase.ABSENT
                    ):
                        continue
                    if obs.phase is launching.Phase.ABSENT and name in self._asking:
                        continue  # not claimed yet: a sweep between its request and answer
                    self._watched.pop(name, None)
                    yield obs
            if not self._supervisor.has_ended():
                await self._supervisor.wait_ended(self._clock, self._poll_interval)

    # --- blocking parts (run in a thread) -----------------------------------------------------

    def _run_dir(self, name: str) -> Path:
        if not _NAME.match(name):
            raise errors.InvalidInput(
                f"process launch name {name!r}: must be 1-253 characters of [A-Za-z0-9._-]"
                " starting alphanumeric"
            )
        return self.root / name

    def _make_root(self) -> None:
        with _platform(f"create the process executor's root {self.root}"):
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            for index in (process_shim.LIVE, process_shim.ENDED, process_shim.HALF_MADE):
                (self.root / index).mkdir(mode=0o700, exist_ok=True)
                os.chmod(self.root / index, 0o700)  # made by an earlier corral: 0755

    def _ready_for_strangers(self) -> None:
        """Check that tenants' commands can run as strangers here (ConfigError, naming the
        setting, if not), and open the path from the state folder down to the run folders
        to them: 0711, so that a command reaches its own work folder and lists nothing."""
        assert self._strangers is not None
        uids = self._strangers.get("uids")
        if uids is not None:
            shown = [Path(p) for p in self._strangers.get("shown", ())]
            with _platform(f"open the path to {self.root} to tenants' commands"):
                os.chmod(self.root, 0o711)
                for folder in self.root.parents:
                    if self._state_dir is None or not folder.is_relative_to(self._state_dir):
                        break
                    os.chmod(folder, 0o711)
                if self._state_dir is not None and self._state_dir.is_dir():
                    os.chmod(self._state_dir, 0o711)  # to the attempt socket's folder too
                for folder in shown:
                    folder.mkdir(mode=0o711, parents=True, exist_ok=True)
                    os.chmod(folder, 0o711)
                closed = next(
                    (c for p in (self.root, *shown) if (c := process_sandbox.unreachable(p))),
                    None,
                )
            if closed is not None:
                raise errors.ConfigError(
                    f"process executor: executors.process.uid_range: {closed} is closed to"
                    f" other users, so tenants' commands could not reach their run folders"
                    f" ({self.root}) and the attempt socket: chmod o+x {closed}, or set"
                    " executors.process.root and state_dir elsewhere"
                )
        why = process_sandbox.probe(
            uid_range=None if uids is None else (uids[0], uids[1]),
            sandbox=self._strangers.get("sandbox"),
            scratch=self.root / f".probe-{os.getpid()}",  # where run folders are
        )
        if why is not None:
            raise errors.ConfigError(f"process executor: {why}")
        log.info(
            "process executor: tenants' commands run %s",
            process_sandbox.describe(self._strangers),
        )

    def _rebuild_index(self) -> None:
        """Index every run folder, live or ended, from what it holds: once for a root made
        by an earlier version, or whose indexes were deleted."""
        live = ended = 0
        with _platform(f"index the run folders in {self.root}"):
            entries = list(os.scandir(self.root))
            legacy = [e for e in entries if e.name.startswith(".tmp-")]
            self._sweep_half_made(legacy, self._clock.now() - self.retention)
            for entry in entries:
                if not _is_run_dir(entry):
                    continue
                try:
                    record = _read_json(Path(entry.path) / "exit.json")
                except errors.ExecutorError:
                    record = None  # a torn record: the live index looks at it again
                if record is None:
                    process_shim.mark_live(self.root, entry.name)
                    live += 1
                    continue
                at = _time(record.get("finished_at"))
                when = at.timestamp() if at else entry.stat().st_mtime
                process_shim.mark_ended(self.root, entry.name, when)
                ended += 1
            (self.root / INDEXED).write_text('{"version": 1}\n', encoding="utf-8")
        log.info("process executor: indexed %d live, %d ended runs in %s", live, ended, self.root)

    def _live_blocking(self, selector: dict[str, str]) -> list[launching.Observation]:
        self._check_root()
        index = self.root / process_shim.LIVE
        with _platform(f"list the live runs in {index}"):
            if not index.is_dir():  # deleted under a running corral: made again, in full
                self._make_root()
                self._rebuild_index()
            names = [n for n in os.listdir(index) if _NAME.match(n)]
        seen = _observe_many({name: self.root / name for name in names})
        absent, found = set(), []
        for name, obs in sorted(seen.items()):
            if obs.phase.finished:  # its supervisor died before it could move the marker
                at = obs.finished_at or self._clock.now()
                process_shim.mark_ended(self.root, name, at.timestamp())
            elif obs.phase is launching.Phase.ABSENT:
                # Marked just before a claim that is under way, or by one that failed: a
                # marker still without its folder a pass later is a failed one's.
                if name in self._absent_before:
                    with contextlib.suppress(OSError):
                        os.unlink(index / name)
                else:
                    absent.add(name)
            elif all(obs.labels.get(k) == v for k, v in selector.items()):
                found.append(obs)
        self._absent_before = absent
        return found

    def _ended_blocking(self, before: datetime) -> list[launching.Observation]:
        self._check_root()
        with _platform(f"list the half-made launches in {self.root / process_shim.HALF_MADE}"):
            self._sweep_half_made(
                list(os.scandir(self.root / process_shim.HALF_MADE)),
                self._clock.now() - self.retention,
            )
        markers = self._old_markers(before)
        seen = _observe_many({name: self.root / name for _, name in markers})
        self._offered = {}
        found = []
        for hour, name in markers:
            marker = self.root / process_shim.ENDED / hour / name
            obs = seen.get(name)
            if obs is None:
                continue  # damaged: left for a person to look at
            if obs.phase is launching.Phase.ABSENT:  # forgotten, or deleted by hand
                with contextlib.suppress(OSError):
                    os.unlink(marker)
            elif not obs.phase.finished:  # the name was launched again: it goes on
                with contextlib.suppress(OSError):
                    os.rename(marker, self.root / process_shim.LIVE / name)
            elif (obs.finished_at or _hour_end(hour)) < before:
                self._offered[name] = marker
                found.append(obs)
        return found

    def _old_markers(self, before: datetime) -> list[tuple[str, str]]:
        """Up to FORGET_BATCH (hour, name) of the ended index in hours that ended before
        `before`, going on after the last offer and starting over once at the end. Reads
        the hours from the last offer on, and stops once the batch is full."""
        index = self.root / process_shim.ENDED
        with _platform(f"list the ended runs in {index}"):
            hours = sorted(h for h in os.listdir(index) if _hour_end(h) <= before)
            batch = self._markers_after(index, hours, self._forget_after)
            if not batch and self._forget_after != ("", ""):
                batch = self._markers_after(index, hours, ("", ""))
        self._forget_after = batch[-1] if len(batch) == FORGET_BATCH else ("", "")
        return batch

    @staticmethod
    def _markers_after(
        index: Path, hours: Sequence[str], after: tuple[str, str]
    ) -> list[tuple[str, str]]:
        batch: list[tuple[str, str]] = []
        for hour in hours:
            if hour < after[0]:
                continue
            names = sorted(os.listdir(index / hour))
            if not names:
                with contextlib.suppress(OSError):  # an old hour made empty by forget
                    (index / hour).rmdir()
            batch += [(hour, n) for n in names if (hour, n) > after][: FORGET_BATCH - len(batch)]
            if len(batch) == FORGET_BATCH:
                break
        return batch

    def _check_root(self) -> None:
        # A root that vanished (deleted, unmounted) must not read as "every launch absent":
        # recovery would launch everything again.
        if not self.root.is_dir():
            raise errors.ExecutorError(f"process executor: run folder root {self.root} is missing")

    def _observe_blocking(self, dirs: Mapping[str, Path]) -> dict[str, launching.Observation]:
        self._check_root()
        return _observe_many(dirs)

    def _list_blocking(self, selector: dict[str, str]) -> list[launching.Observation]:
        self._check_root()
        with _platform(f"list the run folders in {self.root}"):
            entries = sorted(os.scandir(self.root), key=lambda e: e.name)
            dirs = {e.name: Path(e.path) for e in entries if _is_run_dir(e)}
            found = {name: d for name, d in dirs.items() if _matches(d, selector)}
        return list(_observe_many(found).values())

    def _sweep_half_made(self, entries: list[os.DirEntry[str]], before: datetime) -> None:
        """Remove launch folders a crash left half-made (never claimed) that are older than
        the retention: nothing runs in them and no launch waits on them. `entries` are
        those of HALF_MADE (or, as an earlier version made them, `.tmp-*` in the root)."""
        for entry in entries:
            try:
                made = datetime.fromtimestamp(entry.stat().st_mtime, UTC)
            except OSError:
                continue  # claimed or removed since the scan
            if made < before:
                shutil.rmtree(entry.path, ignore_errors=True)

    async def forget(self, names: Sequence[str]) -> None:
        """Remove the run folders of these finished launches (logs, exit record and all).
        The reconciler calls this only for attempts the store holds as ended."""
        dirs = [self._run_dir(name) for name in names]
        await asyncio.to_thread(self._forget_blocking, dirs)

    def _forget_blocking(self, dirs: Sequence[Path]) -> None:
        for run_dir in dirs:
            try:
                ended = _observe_one(run_dir.name, run_dir).phase.finished
            except errors.ExecutorError:
                ended = False
            if not ended:  # only a finished run: never one still going
                continue
            shutil.rmtree(run_dir, ignore_errors=True)
            if (marker := self._offered.pop(run_dir.name, None)) is not None:
                with contextlib.suppress(OSError):
                    os.unlink(marker)
            log.info("%s: finished longer ago than the retention; removed", run_dir.name)


# --- spec checks ------------------------------------------------------------------------------


def _checked_command(command: Any) -> list[str]:
    ok = isinstance(command, list | tuple) and len(command) > 0
    if not ok or not all(isinstance(arg, str) for arg in command):
        raise errors.InvalidInput(
            base.spec_error(KIND, "command", "must be a non-empty list of strings")
        )
    if not command[0].strip():  # an empty argument is fine (grep '' file); no program is not
        raise errors.InvalidInput(
            base.spec_error(KIND, "command", "its first item, the program to run, is empty")
        )
    if any("\0" in arg for arg in command):
        raise errors.InvalidInput(base.spec_error(KIND, "command", "must not contain NUL bytes"))
    return list(command)


def _checked_env(env: Any) -> dict[str, str]:
    ok = isinstance(env, Mapping) and all(
        isinstance(k, str) and k and "=" not in k and "\0" not in k + v
        for k, v in env.items()
        if isinstance(v, str)
    )
    ok = ok and all(isinstance(v, str) for v in env.values())
    if not ok:
        raise errors.InvalidInput(
            base.spec_error(KIND, "env", "must be a mapping of variable names to strings")
        )
    return dict(env)


def _checked_cwd(cwd: Any) -> str:
    if not isinstance(cwd, str) or not cwd or "\0" in cwd:
        raise errors.InvalidInput(base.spec_error(KIND, "cwd", "must be a non-empty path"))
    return cwd


# --- launching -------------------------------------------------------------------------------


@contextlib.contextmanager
def _platform(doing: str) -> Iterator[None]:
    """Translate the operating system's errors into ExecutorError, keeping the cause."""
    try:
        yield
    except OSError as exc:
        raise errors.ExecutorError(f"process executor could not {doing}: {exc}") from exc


def _launch_files(launch: launching.Launch, spec: dict[str, Any], log_bytes: int) -> dict[str, Any]:
    """What a run folder starts with, by file name: the supervisor writes them (the payload,
    when there is one, as JSON text, so that it is written as every executor delivers it)."""
    launch_doc = {
        "name": launch.name,
        "labels": dict(launch.labels),
        "spec": spec,
        "env": dict(launch.env),
        "deadline_seconds": launch.deadline_seconds,
        "cwd": os.path.join(os.getcwd(), spec.get("cwd", "")),
        "log_bytes": log_bytes,
    }
    files: dict[str, Any] = {"launch.json": launch_doc, "labels.json": dict(launch.labels)}
    if (payload := launching.payload_json(launch.payload)) is not None:
        files[process_shim.PAYLOAD_FILE] = payload
    return files


def _write_json(path: Path, data: Any) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
        fh.flush()
        os.fsync(fh.fileno())


class _Lost(errors.ExecutorError):
    """The supervisor was gone before it answered: the launch may be asked again."""


class _Supervisor:
    """This executor's end of its supervisor (process_shim.Supervisor): started at the
    first launch and again whenever it is found dead; a request per launch, and its
    answer; and the names of the runs whose commands it says ended."""

    def __init__(self) -> None:
        self.pid: int | None = None
        """The supervisor's pid, once it has said it."""
        self._sock: socket.socket | None = None
        self._ids = 0
        self._waiting: dict[int, asyncio.Future[str]] = {}
        self._names: dict[int, str] = {}  # request id -> run name, until its shim ends
        self._ended: dict[str, dict[str, Any] | None] = {}  # name -> exit record, if told
        self._unrecorded: set[str] = set()  # ended, and their exit never written
        self._news = asyncio.Event()
        self._heard_so_far = bytearray()  # the start of a line not yet whole
        self._starting: asyncio.Future[socket.socket] | None = None  # shared by the launches
        self._closed = False

    async def supervise(
        self,
        run_dir: Path,
        files: dict[str, Any],
        kill_grace: float,
        clk: clock.Clock,
        *,
        log: Path,
    ) -> str:
        """Have the supervisor make `run_dir` with `files` and start it; its answer,
        `started`, or `exists` when the name is there already. ExecutorError when it fails,
        or gives no answer in time. A request whose supervisor is found gone before it
        answered is asked once more of a new one: a launch is idempotent by name (the
        rename lets one through, and a second ask of a launched name answers `exists`)."""
        for last in (False, True):
            try:
                return await self._ask(run_dir, files, kill_grace, clk, log)
            except _Lost:
                if last:
                    raise
        raise AssertionError("unreachable")

    async def _ask(
        self, run_dir: Path, files: dict[str, Any], kill_grace: float, clk: clock.Clock, log: Path
    ) -> str:
        loop = asyncio.get_running_loop()
        self._ids += 1
        ask = self._ids
        answer: asyncio.Future[str] = loop.create_future()
        request = {"id": ask, "run": str(run_dir), "files": files, "grace": kill_grace}
        self._waiting[ask], self._names[ask] = answer, run_dir.name
        try:
            try:
                sock = await self._ready(log)
                sending = loop.sock_sendall(sock, json.dumps(request).encode() + b"\n")
                await asyncio.wait_for(sending, SHIM_ANSWER_SECONDS)
            except TimeoutError:
                self._lost("it took no request for too long")
                raise errors.ExecutorError(
                    f"process launch {run_dir.name!r}: the supervisor took no request in"
                    f" {SHIM_ANSWER_SECONDS:g}s"
                ) from None
            except OSError as exc:  # it died since the last request
                self._names.pop(ask, None)
                self._lost(f"its socket refused a request: {exc}")
                raise _Lost(f"process launch {run_dir.name!r}: {exc}") from exc
            until = clk.monotonic() + SHIM_ANSWER_SECONDS
            while not answer.done():
                if clk.monotonic() >= until:
                    raise errors.ExecutorError(
                        f"process launch {run_dir.name!r}: no answer in {SHIM_ANSWER_SECONDS:g}s"
                    )
                await asyncio.wait({answer}, timeout=0.5)
            return await answer
        finally:
            self._waiting.pop(ask, None)

    def take_ended(self) -> dict[str, dict[str, Any] | None]:
        """The names whose commands ended since the last call, each with its exit record
        as the supervisor put it in place (None: not told, read the folder)."""
        ended, self._ended = self._ended, {}
        self._news.clear()
        return ended

    def take_unrecorded(self) -> set[str]:
        """The names whose commands ended unrecorded since the last call."""
        unrecorded, self._unrecorded = self._unrecorded, set()
        return unrecorded

    def has_ended(self) -> bool:
        return bool(self._ended)

    async def wait_ended(self, clk: clock.Clock, seconds: float) -> None:
        """Until a command ends, or for `seconds` of `clk`."""
        news = asyncio.ensure_future(self._news.wait())
        pause = asyncio.ensure_future(clk.sleep(seconds))
        try:
            await asyncio.wait({news, pause}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            news.cancel()
            pause.cancel()

    async def _ready(self, log: Path) -> socket.socket:
        """The socket to a live supervisor, one started now if there is none (once for all
        the launches that ask meanwhile). One that died is seen as the end of its socket
        (nobody else holds its end)."""
        if self._sock is not None:
            return self._sock
        if self._starting is None or self._starting.done():
            self._starting = asyncio.ensure_future(self._start(log))
        return await asyncio.shield(self._starting)  # one launch given up: not the others'

    async def _start(self, log: Path) -> socket.socket:
        # In a thread: an interpreter's start takes a while, and the loop goes on meanwhile
        # (the other launches of the tick take their turns and wait here with this one).
        mine = await asyncio.to_thread(_start_supervisor, log)
        if self._closed:
            mine.close()
            raise errors.ExecutorError("process executor: closed; no more launches")
        mine.setblocking(False)
        asyncio.get_running_loop().add_reader(mine.fileno(), self._read)
        self._sock = mine
        self._heard_so_far = bytearray()
        return mine

    def _read(self) -> None:
        while (sock := self._sock) is not None:
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                return
            except OSError as exc:
                self._lost(f"its socket failed: {exc}")
                return
            if not data:
                self._lost("the supervisor is gone")
                return
            self._heard_so_far += data
            if b"\n" not in data:
                continue  # a long line (a run's output) comes in many reads: joined once
            *lines, rest = self._heard_so_far.split(b"\n")
            self._heard_so_far = bytearray(rest)
            for line in lines:
                try:
                    message = json.loads(line)
                except ValueError:
                    log.warning("process executor: the supervisor said %r", line[:200])
                    continue
                if isinstance(message, dict):
                    self._heard(message)

    def _heard(self, message: dict[str, Any]) -> None:
        if isinstance(supervisor := message.get("supervisor"), int):
            self.pid = supervisor
            log.info("process executor: supervisor started (pid %d)", supervisor)
            return
        ask = message.get("id")
        if not isinstance(ask, int):
            return
        name = self._names.get(ask)
        answer = self._waiting.get(ask)
        if answer is not None and not answer.done():
            if "error" in message:
                why = message["error"]
                answer.set_exception(errors.ExecutorError(f"process launch {name!r} failed: {why}"))
            elif message.get("answer") in ("started", "exists"):
                answer.set_result(message["answer"])
            elif message.get("ended"):
                answer.set_exception(errors.ExecutorError(f"process launch {name!r}: no answer"))
        if message.get("ended") and (name := self._names.pop(ask, None)) is not None:
            record = message.get("exit")
            if isinstance(record, dict) and isinstance(output := message.get("output"), dict):
                record = {**record, "output": output}
            self._ended[name] = record if isinstance(record, dict) else None
            if message.get("unrecorded"):
                self._unrecorded.add(name)
            self._news.set()
        elif "error" in message or message.get("answer") == "exists":
            self._names.pop(ask, None)  # no run: nothing will end

    def _lost(self, why: str) -> None:
        """The supervisor is gone: what waits for an answer is asked again of a new one.
        Runs already started are not touched: `events` sweeps them."""
        for ask, answer in list(self._waiting.items()):
            if not answer.done():
                name = self._names.pop(ask, None)
                answer.set_exception(_Lost(f"process launch {name!r}: no answer ({why})"))
        log.warning(
            "process executor: supervisor %s lost (%s); the next launch starts one",
            self.pid,
            why,
        )
        self.pid = None
        self._drop()

    def _drop(self) -> None:
        """Let go of the socket: a supervisor still there takes no more launches."""
        if self._sock is not None:
            with contextlib.suppress(Exception):  # a closed loop has no reader left to remove
                asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None

    async def close(self) -> None:
        self._closed = True
        self._drop()


def _start_supervisor(log: Path) -> socket.socket:
    """Start a supervisor (detached: its first process exits once the second is on its
    own); this end of the socket it reads."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with _platform("start the process executor's supervisor"):
            started = subprocess.run(
                [sys.executable, "-I", str(SHIM), "--supervisor", str(theirs.fileno()), str(log)],
                pass_fds=[theirs.fileno()],
                start_new_session=True,
                timeout=SHIM_ANSWER_SECONDS,
                check=False,
            )
        if started.returncode != 0:
            raise errors.ExecutorError(
                f"process executor: its supervisor did not start (exit {started.returncode})"
            )
    except subprocess.TimeoutExpired:
        mine.close()
        raise errors.ExecutorError("process executor: its supervisor did not start") from None
    except BaseException:
        mine.close()
        raise
    finally:
        theirs.close()
    return mine


def _check_same_identity(run_dir: Path, launch: launching.Launch) -> None:
    """Return if `run_dir` belongs to `launch`'s attempt, else raise LaunchConflict."""
    with _platform(f"read the labels of {launch.name!r}"):
        theirs = _read_json(run_dir / "labels.json") or {}
    mine, other = model.identity_from_labels(launch.labels), model.identity_from_labels(theirs)
    if mine == other and (mine is not None or dict(launch.labels) == theirs):
        return
    raise errors.LaunchConflict(
        f"launch name {launch.name!r} already exists for"
        f" {model.describe_identity(other, theirs)},"
        f" not for {model.describe_identity(mine, launch.labels)}"
    )


# --- observing -------------------------------------------------------------------------------


def _observe_many(dirs: Mapping[str, Path]) -> dict[str, launching.Observation]:
    """Observations by name; a run folder that cannot be read is left out (unknown), so
    one damaged folder does not hide the others."""
    seen = {}
    for name, run_dir in dirs.items():
        try:
            seen[name] = _observe_one(name, run_dir)
        except errors.ExecutorError as exc:
            log.warning("%s", exc)
    return seen


def _observe_one(name: str, run_dir: Path) -> launching.Observation:
    with _platform(f"observe {name!r}"):
        if not run_dir.is_dir():
            return launching.Observation(name=name, phase=launching.Phase.ABSENT)
        labels = _read_json(run_dir / "labels.json") or {}
        finished = _finished(name, run_dir, labels)
        if finished is not None:
            return finished
        child = _read_pid(run_dir / "child.pid")
        started_at = _time(child.get("started_at")) if child else None
        if _alive(_read_pid(run_dir / "shim.pid")):
            phase = launching.Phase.RUNNING if child else launching.Phase.PENDING
            return launching.Observation(name, phase, labels, started_at=started_at)
        if _alive(child):  # the supervisor was killed, the command was not: it still runs
            return launching.Observation(
                name, launching.Phase.RUNNING, labels, reason=SUPERVISOR_DIED, started_at=started_at
            )
        # The shim may have written exit.json and ended since we first looked.
        return _finished(name, run_dir, labels) or launching.Observation(
            name,
            launching.Phase.FAILED,
            labels,
            reason=SUPERVISOR_DIED,
            started_at=started_at,
            failure_class=model.FailureClass.TRANSIENT,
            message=_last_line(run_dir / "stderr.log"),
        )


def _finished(name: str, run_dir: Path, labels: dict[str, str]) -> launching.Observation | None:
    record = _read_json(run_dir / "exit.json")
    return None if record is None else _from_record(name, run_dir, labels, record)


def _from_record(
    name: str, run_dir: Path, labels: Mapping[str, str], record: Mapping[str, Any]
) -> launching.Observation:
    """What `exit.json` (`record`) says of a finished run; a failure's message is the last
    line of its stderr. Its output is the record's when the supervisor said it, else read
    from the folder."""
    succeeded = bool(record.get("succeeded", record.get("exit_code") == 0))
    said = record.get("output")
    started, finished = _time(record.get("started_at")), _time(record.get("finished_at"))
    output = run_log(
        said if isinstance(said, dict) else _tails(run_dir, LOG_TAIL_BYTES),
        None if started is None or finished is None else (finished - started).total_seconds(),
    )
    return launching.Observation(
        name=name,
        phase=launching.Phase.SUCCEEDED if succeeded else launching.Phase.FAILED,
        labels=labels,
        exit_code=record.get("exit_code"),
        reason=record.get("reason"),
        started_at=started,
        finished_at=finished,
        failure_class=None if succeeded else _verdict(record),
        message=None if succeeded else _last_line(run_dir / "stderr.log"),
        output=output,
    )


LOG_TAIL_BYTES = launching.STREAM_BYTES
"""How much of each log is read back from a run folder whose end the supervisor did not
say (recovery, a sweep): the default, as the run folder does not record the setting."""


def _tails(run_dir: Path, limit: int) -> dict[str, Any]:
    """What the supervisor says of a run's logs (process_shim.output_tails), read from its
    folder."""
    out = {}
    for name in process_shim.LOGS:
        try:
            with (run_dir / name).open("rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(size - limit, 0))
                data = f.read(limit)
        except OSError:
            continue
        if size:
            out[name.removesuffix(".log")] = {"bytes": size, "tail": data}
    return out


def run_log(tails: Mapping[str, Any], latency: float | None) -> launching.RunLog:
    """A command's run log: the tails of its stdout and stderr, as the supervisor said them
    (process_shim.output_tails) or as read (bytes)."""
    streams = []
    for name in ("stdout", "stderr"):
        said = tails.get(name)
        if not isinstance(said, Mapping):
            continue
        tail = said.get("tail", b"")
        if isinstance(tail, str):  # said by the supervisor: text, or base64 when not UTF-8
            data = base64.b64decode(tail) if said.get("base64") else tail.encode()
        else:
            data = bytes(tail)
        size = int(said.get("bytes", len(data)))
        cut = size > len(data)
        streams.append(launching.Stream(name, launching.decoded(data, cut_before=cut), size, cut))
    return launching.RunLog(streams=tuple(streams), latency=latency)


_TRANSIENT_REASONS = ("deadline exceeded", "supervisor terminated", SUPERVISOR_DIED)


def _verdict(record: Mapping[str, Any]) -> model.FailureClass | None:
    """This platform's own class for a failure, where it knows better than exit-code rules:
    stopped at the deadline or killed by SIGKILL (the OOM killer's signal) is transient, a
    command that could not start at all is permanent, unless this machine was short of
    descriptors, processes or memory. None: let the job's rules decide."""
    reason, code = str(record.get("reason") or ""), record.get("exit_code")
    if reason in _TRANSIENT_REASONS or code == -signal.SIGKILL:
        return model.FailureClass.TRANSIENT
    if reason.startswith(process_shim.NO_RESOURCES):
        return model.FailureClass.TRANSIENT
    if reason.startswith(process_shim.START_FAILED):
        return model.FailureClass.PERMANENT
    return None


def _last_line(path: Path, tail: int = 4096) -> str | None:
    """The last non-empty line of a log file (from its last `tail` bytes), if any."""
    try:
        with path.open("rb") as f:
            f.seek(max(f.seek(0, os.SEEK_END) - tail, 0))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if line := line.strip():
            return line[:500]
    return None


def _read_json(path: Path) -> Any:
    """The JSON in `path`, or None when there is no such file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise errors.ExecutorError(f"process executor found a damaged file {path}: {exc}") from exc


def _read_pid(path: Path) -> Any:
    """A pid record, or None when there is none, or it is damaged: it is only written whole
    (a rename), so a damaged one is a power cut's, and no process outlives that."""
    try:
        return _read_json(path)
    except errors.ExecutorError:
        return None


def _time(value: Any) -> datetime | None:
    try:
        at = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None
    return at if at is None or at.tzinfo is not None else at.replace(tzinfo=UTC)


def _hour_end(hour: str) -> datetime:
    """When an hour of the ended index ends (its name is YYYYMMDDHH, in UTC); the far
    future for a name that is not one, so nothing is offered from it."""
    try:
        return datetime.strptime(hour, "%Y%m%d%H").replace(tzinfo=UTC) + timedelta(hours=1)
    except ValueError:
        return datetime.max.replace(tzinfo=UTC)


def _has_exit(run_dir: Path) -> bool:
    return (run_dir / "exit.json").exists()


def _is_run_dir(entry: os.DirEntry[str]) -> bool:
    return not entry.name.startswith(".") and entry.is_dir()


def _matches(run_dir: Path, selector: Mapping[str, str]) -> bool:
    try:
        labels = _read_json(run_dir / "labels.json") or {}
    except errors.ExecutorError as exc:  # one damaged folder must not hide the others
        log.warning("%s", exc)
        return False
    return all(labels.get(key) == value for key, value in selector.items())


# --- processes ---------------------------------------------------------------------------------


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time) of a live pid from /proc/<pid>/stat, or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = stat.rpartition(")")[2].split()
    return fields[0], int(fields[19])


def _alive(record: Any) -> bool:
    """Whether the process in a `*.pid` record still runs (same pid AND same start time)."""
    if not isinstance(record, dict) or not isinstance(record.get("pid"), int):
        return False
    stat = _proc_stat(record["pid"])
    if stat is None or stat[0] == "Z":
        return False
    return record.get("start_time") is None or stat[1] == record["start_time"]


def _cancel_begin(run_dir: Path, grace_seconds: float) -> bool:
    """Mark the run as cancelled and SIGTERM its command; False if there is nothing to stop."""
    with _platform(f"cancel {run_dir.name!r}"):
        if not run_dir.is_dir() or _has_exit(run_dir):
            return False
        marker = run_dir / "cancel"
        tmp = run_dir / ".cancel.tmp"
        _write_json(tmp, {"grace_seconds": grace_seconds})
        os.rename(tmp, marker)
    _signal_child_group(run_dir, signal.SIGTERM)
    return True


def _signal_child_group(run_dir: Path, sig: signal.Signals) -> None:
    """Send `sig` to the command's process group, if the command is still the one we started."""
    with _platform(f"signal {run_dir.name!r}"):
        child = _read_pid(run_dir / "child.pid")
        if _has_exit(run_dir) or not _alive(child):
            return
        sandboxed = bool(child and child.get("sandboxed"))
        process_sandbox.signal_run(child["pid"], sig, sandboxed=sandboxed)


# --- earlier copies of a run -------------------------------------------------------------------


class _Process(NamedTuple):
    """A live process of a run, as /proc showed it (the start time tells it from a newer
    process that got the same pid)."""

    is_command: bool  # False sorts first: a supervisor is stopped before its command
    pid: int
    start_time: int


def _stop_processes_of_run(run_dir: Path) -> set[_Process]:
    """SIGKILL the live processes of `run_dir`'s run (see `_processes_of_run`) and return
    them; no shim can claim the folder meanwhile (the root's lock, held exclusively)."""
    with (
        _platform(f"lock {run_dir.parent} to look for earlier processes"),
        process_shim.claims_lock(run_dir.parent, exclusive=True),
    ):
        found = _processes_of_run(run_dir)
        _kill_groups(found)
    return found


def _processes_of_run(run_dir: Path) -> set[_Process]:
    """The live processes of `run_dir`'s run, unless the folder is there (then they are the
    launch itself, and another corral may have just made it: nothing to stop)."""
    if run_dir.exists():
        return set()
    mark = f"CORRAL_RUN_DIR={run_dir}".encode()
    found = set()
    with _platform(f"look for earlier processes of {run_dir.name!r} in /proc"):
        me = str(os.getpid())
        entries = [e for e in os.scandir("/proc") if e.name.isdigit() and e.name != me]
    for entry in entries:
        is_command = _belongs(entry.path, run_dir, mark)
        stat = None if is_command is None else _proc_stat(int(entry.name))
        if is_command is not None and stat is not None and stat[0] != "Z":
            found.add(_Process(is_command, int(entry.name), stat[1]))
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
    shim = any(arg.endswith(SHIM.name.encode()) for arg in argv)
    return False if shim and str(run_dir).encode() in argv else None


def _kill_groups(found: set[_Process]) -> None:
    """SIGKILL each process's group (what it started goes with it), if it is still the one
    found; never corral's own group."""
    for proc in sorted(found):
        stat = _proc_stat(proc.pid)
        if stat is None or stat[1] != proc.start_time:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            group = os.getpgid(proc.pid)
            if group == os.getpgrp():
                os.kill(proc.pid, signal.SIGKILL)
            else:
                os.killpg(group, signal.SIGKILL)
