"""A job's output as it comes: a running process's run folder read as it grows, a pod's
log followed through its executor, and each ended attempt's run log."""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from corral import launching, model, store
from corral.client import service
from corral.executors import base

log = logging.getLogger("corral.client")


@dataclass(frozen=True, slots=True)
class LogPart:
    """A piece of an attempt's output, as `Client.follow` yields it: `text` of `stream`
    (stdout, stderr, request, response), read live from a running process's run folder
    or from the run log the attempt left; an ended attempt that left nothing to read is
    one part with no stream."""

    attempt: model.Attempt
    stream: str
    text: str
    log: launching.RunLog | None = None  # the stored run log it comes from, if it does


class _Logs:
    """A job's run logs, read from the store once, when first asked."""

    def __init__(self, db: store.Store, job_id: int) -> None:
        self.db, self.job_id = db, job_id
        self.found: Mapping[int, launching.RunLog] | None = None

    async def get(self, fence: int) -> launching.RunLog | None:
        if self.found is None:
            self.found = await self.db.runlogs.of_job(job_id=self.job_id)
        return self.found.get(fence)


class _Tail:
    """A running process's stdout and stderr, read as they grow from its run folder (the
    last STREAM_BYTES of each at first); nothing while the folder is not there."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.at: dict[str, int] = {}
        self.decoders = {n: codecs.getincrementaldecoder("utf-8")("replace") for n in _STREAMS}

    def read(self, *, last: bool = False) -> list[tuple[str, str]]:
        """What each stream gained since the last read; `last`: the command has ended, so
        a character cut at the end is shown as such, not held back."""
        parts = []
        for name in _STREAMS:
            try:
                with (self.run_dir / f"{name}.log").open("rb") as f:
                    size = f.seek(0, os.SEEK_END)
                    at = min(self.at.setdefault(name, max(size - launching.STREAM_BYTES, 0)), size)
                    f.seek(at)
                    data = f.read(size - at)
            except OSError:
                continue
            self.at[name] = at + len(data)
            if text := self.decoders[name].decode(data, final=last):
                parts.append((name, text))
        return parts

    async def take(self, *, last: bool = False) -> list[tuple[str, str]]:
        return await asyncio.to_thread(self.read, last=last)

    def close(self) -> None:
        """Nothing to stop: each read opens the files anew."""


class _Follow:
    """A running attempt's output read as it comes from its platform, away from the machine
    it runs on (a Kubernetes pod's log, through the executor's `follow_log`), in a task of
    its own; a follow that breaks leaves the attempt's run log to be read at its end."""

    def __init__(self, follower: base.FollowsLogs, name: str) -> None:
        self.chunks: list[bytes] = []
        self.at = 0  # bytes handed out
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.task = asyncio.create_task(self._read(follower, name))

    async def _read(self, follower: base.FollowsLogs, name: str) -> None:
        try:
            async for chunk in follower.follow_log(name):
                self.chunks.append(chunk)
        except Exception as exc:  # any failure of the platform: the run log is read instead
            log.info("following the output of %s stopped: %r", name, exc)

    async def take(self, *, last: bool = False) -> list[tuple[str, str]]:
        """What came since the last take; `last`: the attempt has ended, so what is still
        on its way is waited for a little (FOLLOW_END_WAIT), and the follow ends."""
        if last:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.task), FOLLOW_END_WAIT)
            self.close()
        data = b"".join(self.chunks)
        self.chunks.clear()
        self.at += len(data)
        text = self.decoder.decode(data, final=last)
        return [(_FOLLOWED, text)] if text else []

    def close(self) -> None:
        self.task.cancel()


FOLLOW_END_WAIT = 5.0
"""How long, once an attempt has ended, its followed output may take to finish arriving."""
_FOLLOWED = "log"  # a followed platform log is one stream, named as its run log names it
_STREAMS = ("stdout", "stderr")
_GOES_ON = frozenset({model.JobState.SCHEDULED, model.JobState.QUEUED, model.JobState.RUNNING})
"""A job in these states has attempts to come: `follow` waits for them. (A quarantined or
parked one waits for a person or a worker: following stops.)"""


class Follow(service.Service):
    """A job's output, live while it runs."""

    async def follow(
        self,
        job_id: int,
        *,
        attempt_no: int | None = None,
        every: float = 0.25,
        once: bool = False,
    ) -> AsyncIterator[LogPart]:
        """A job's output as it comes, until the job has finished, or stopped for a person
        (or attempt `attempt_no` has ended): each ended attempt's run log, and a running
        process's stdout and stderr live from its run folder when this machine has it, or a
        running pod's log through an executor that follows logs (else its run log once it
        ends). `once`: what there is now, without waiting."""
        done: set[int] = set()
        tails: dict[int, _Tail | _Follow] = {}  # running attempts followed live, by fence
        try:
            async for part in self._follow(job_id, attempt_no, every, once, done, tails):
                yield part
        finally:
            for tail in tails.values():
                tail.close()

    async def _follow(
        self,
        job_id: int,
        attempt_no: int | None,
        every: float,
        once: bool,
        done: set[int],
        tails: dict[int, _Tail | _Follow],
    ) -> AsyncIterator[LogPart]:
        while True:
            job = await self.store.jobs.get(job_id=job_id)  # then its attempts: none missed
            attempts = await self.store.attempts.list(job_id=job_id)
            wanted = [a for a in attempts if attempt_no in (None, a.attempt_no)]
            logs = _Logs(self.store, job_id)  # read once an ended attempt needs them
            for a in wanted:
                if a.id not in done:
                    parts, ended = await self._output_now(a, tails, logs)
                    for part in parts:
                        yield part
                    if ended:
                        done.add(a.id)
            over = job.state not in _GOES_ON or (
                attempt_no is not None and bool(wanted) and wanted[0].id in done
            )
            if once or (over and all(a.id in done for a in wanted)):
                return
            await self.clock.sleep(every)

    async def _output_now(
        self, a: model.Attempt, tails: dict[int, _Tail | _Follow], logs: _Logs
    ) -> tuple[list[LogPart], bool]:
        """What attempt `a` has to show now, and whether that is all it will show: a
        running attempt's new output (its run folder, its pod's log), or an ended attempt's run log
        (unless its output was read live here, to its end)."""
        live = a.state in model.ACTIVE_ATTEMPT_STATES
        if a.id not in tails and live and (reader := self._live_output(a)) is not None:
            tails[a.id] = reader
        parts = []
        if (tail := tails.get(a.id)) is not None:
            read = await tail.take(last=not live)
            parts = [LogPart(a, stream, text) for stream, text in read]
            if not live:
                tails.pop(a.id)
        if live or (tail is not None and tail.at):
            return parts, not live
        found = await logs.get(a.id)
        if found is None or not found.streams:  # it ended with nothing to read
            return [*parts, LogPart(a, "", "", found)], True
        return [*parts, *(LogPart(a, s.name, s.text, found) for s in found.streams)], True

    def _live_output(self, a: model.Attempt) -> _Tail | _Follow | None:
        """Where a running attempt's output is read as it comes, if anywhere: a process's
        run folder, or an executor that follows its platform's log."""
        if a.executor == "process":
            return _Tail(self.settings.process_root / a.launch_name)
        follower = self.executors.get(a.executor)
        if isinstance(follower, base.FollowsLogs):
            return _Follow(follower, a.launch_name)
        return None
