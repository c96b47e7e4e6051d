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

This module holds the executor and its indexes; reading a run folder is process_runs.py's,
talking to the supervisor process_supervisor.py's, stopping a run's processes
process_stop.py's, readying the root for tenants' commands process_strangers.py's, and the
supervisor itself process_shim.py's.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import os
import re
import shutil
import signal
from collections.abc import AsyncGenerator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from corral import clock, errors, launching, model
from corral.executors import (
    base,
    process_folder,
    process_runs,
    process_stop,
    process_strangers,
    process_supervisor,
)

log = logging.getLogger("corral.executors.process")

KIND = "process"
KILL_GRACE_SECONDS = 10.0
"""By default, how long a command gets between SIGTERM and SIGKILL when its deadline passes."""
SWEEP_EVERY = 10
"""`events` looks at every run it watches once in this many poll intervals, besides the
runs the supervisor says ended: a command whose supervisor was killed ends unannounced."""
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
        self._supervisor = process_supervisor.Supervisor()
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
            await asyncio.to_thread(
                process_strangers.prepare, self.root, self._strangers, self._state_dir
            )
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
            await self._claim(launch, spec, run_dir)
        except BaseException:
            if not watched:
                self._watched.pop(launch.name, None)
            raise
        finally:
            self._asking[launch.name] -= 1
            if self._asking[launch.name] <= 0:
                del self._asking[launch.name]

    async def _claim(self, launch: launching.Launch, spec: dict[str, Any], run_dir: Path) -> None:
        """Have the supervisor claim `run_dir` and start `launch`'s command there; a name
        claimed already counts as launched when it holds this attempt's identity."""
        # Recovery asks again for launches it finds (before it adopts them): a claimed
        # name is one the supervisor would answer `exists` for, so no request is made
        # (nor a supervisor started). A first launch does not look: it is rarely there.
        claimed = launch.relaunch and await asyncio.to_thread(os.path.lexists, run_dir)
        if not claimed:
            files = process_supervisor.launch_files(launch, spec, self._log_bytes)
            if launch.stranger:
                files["launch.json"]["stranger"] = self._strangers
            answer = await self._supervisor.supervise(
                run_dir, files, self._kill_grace, self._clock, log=self._log
            )
            claimed = answer == "exists"
        if claimed:
            await asyncio.to_thread(process_runs.check_same_identity, run_dir, launch)

    async def _stop_earlier_copies(self, run_dir: Path) -> None:
        """SIGKILL every process still running for `run_dir` while the folder is missing, and
        wait until none is left; ExecutorError if one outlives the wait, so that recovery
        tries again later instead of starting a second copy beside it."""
        run = run_dir.name
        until = self._clock.monotonic() + max(self._kill_grace, STOP_WAIT_SECONDS)
        stopped: set[process_stop.RunProcess] = set()
        while found := await asyncio.to_thread(process_stop.stop_processes_of_run, run_dir):
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
        if not await asyncio.to_thread(process_stop.cancel_begin, run_dir, seconds):
            return
        until = self._clock.monotonic() + seconds
        while (left := until - self._clock.monotonic()) > 0:
            if await asyncio.to_thread(process_runs.has_exit, run_dir):
                return
            await self._clock.sleep(min(self._poll_interval, left))
        await asyncio.to_thread(process_stop.signal_child_group, run_dir, signal.SIGKILL)

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
                seen = await self._seen(names, ended)
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

    async def _seen(
        self, names: set[str], ended: Mapping[str, Mapping[str, Any] | None]
    ) -> dict[str, launching.Observation]:
        """What became of the runs `names`: a success the supervisor told (`ended`: its
        record is in place, as it says) needs no look at its folder; the rest are read
        from their folders, and one whose exit went unrecorded fails, transient."""
        seen = {
            name: process_runs.from_record(name, self._run_dir(name), self._watched[name], record)
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
        return seen

    # --- blocking parts (run in a thread) -----------------------------------------------------

    def _run_dir(self, name: str) -> Path:
        if not _NAME.match(name):
            raise errors.InvalidInput(
                f"process launch name {name!r}: must be 1-253 characters of [A-Za-z0-9._-]"
                " starting alphanumeric"
            )
        return self.root / name

    def _make_root(self) -> None:
        with process_runs.os_errors(f"create the process executor's root {self.root}"):
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            for index in (process_folder.LIVE, process_folder.ENDED, process_folder.HALF_MADE):
                (self.root / index).mkdir(mode=0o700, exist_ok=True)
                os.chmod(self.root / index, 0o700)  # made by an earlier corral: 0755

    def _rebuild_index(self) -> None:
        """Index every run folder, live or ended, from what it holds: once for a root made
        by an earlier version, or whose indexes were deleted."""
        live = ended = 0
        with process_runs.os_errors(f"index the run folders in {self.root}"):
            entries = list(os.scandir(self.root))
            legacy = [e for e in entries if e.name.startswith(".tmp-")]
            self._sweep_half_made(legacy, self._clock.now() - self.retention)
            for entry in entries:
                if not process_runs.is_run_dir(entry):
                    continue
                try:
                    record = process_runs.read_json(Path(entry.path) / "exit.json")
                except errors.ExecutorError:
                    record = None  # a torn record: the live index looks at it again
                if record is None:
                    process_folder.mark_live(self.root, entry.name)
                    live += 1
                    continue
                at = process_runs.parse_time(record.get("finished_at"))
                when = at.timestamp() if at else entry.stat().st_mtime
                process_folder.mark_ended(self.root, entry.name, when)
                ended += 1
            (self.root / INDEXED).write_text('{"version": 1}\n', encoding="utf-8")
        log.info("process executor: indexed %d live, %d ended runs in %s", live, ended, self.root)

    def _live_blocking(self, selector: dict[str, str]) -> list[launching.Observation]:
        self._check_root()
        index = self.root / process_folder.LIVE
        with process_runs.os_errors(f"list the live runs in {index}"):
            if not index.is_dir():  # deleted under a running corral: made again, in full
                self._make_root()
                self._rebuild_index()
            names = [n for n in os.listdir(index) if _NAME.match(n)]
        seen = process_runs.observe_many({name: self.root / name for name in names})
        absent, found = set(), []
        for name, obs in sorted(seen.items()):
            if obs.phase.finished:  # its supervisor died before it could move the marker
                at = obs.finished_at or self._clock.now()
                process_folder.mark_ended(self.root, name, at.timestamp())
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
        with process_runs.os_errors(
            f"list the half-made launches in {self.root / process_folder.HALF_MADE}"
        ):
            self._sweep_half_made(
                list(os.scandir(self.root / process_folder.HALF_MADE)),
                self._clock.now() - self.retention,
            )
        markers = self._old_markers(before)
        seen = process_runs.observe_many({name: self.root / name for _, name in markers})
        self._offered = {}
        found = []
        for hour, name in markers:
            marker = self.root / process_folder.ENDED / hour / name
            obs = seen.get(name)
            if obs is None:
                continue  # damaged: left for a person to look at
            if obs.phase is launching.Phase.ABSENT:  # forgotten, or deleted by hand
                with contextlib.suppress(OSError):
                    os.unlink(marker)
            elif not obs.phase.finished:  # the name was launched again: it goes on
                with contextlib.suppress(OSError):
                    os.rename(marker, self.root / process_folder.LIVE / name)
            elif (obs.finished_at or process_runs.hour_end(hour)) < before:
                self._offered[name] = marker
                found.append(obs)
        return found

    def _old_markers(self, before: datetime) -> list[tuple[str, str]]:
        """Up to FORGET_BATCH (hour, name) of the ended index in hours that ended before
        `before`, going on after the last offer and starting over once at the end. Reads
        the hours from the last offer on, and stops once the batch is full."""
        index = self.root / process_folder.ENDED
        with process_runs.os_errors(f"list the ended runs in {index}"):
            hours = sorted(h for h in os.listdir(index) if process_runs.hour_end(h) <= before)
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
        return process_runs.observe_many(dirs)

    def _list_blocking(self, selector: dict[str, str]) -> list[launching.Observation]:
        self._check_root()
        with process_runs.os_errors(f"list the run folders in {self.root}"):
            entries = sorted(os.scandir(self.root), key=lambda e: e.name)
            dirs = {e.name: Path(e.path) for e in entries if process_runs.is_run_dir(e)}
            found = {
                name: d for name, d in dirs.items() if process_runs.matches_selector(d, selector)
            }
        return list(process_runs.observe_many(found).values())

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
                ended = process_runs.observe_one(run_dir.name, run_dir).phase.finished
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
