"""Reading a run folder of the `process` executor: what its files say of its launch
(labels, pid records, the exit record, the logs' tails), whether its processes still
live (/proc), and the Observation that makes. The folder's layout is process.py's
docstring; its writer is the supervisor (process_shim.py).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import signal
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from corral import errors, launching, model
from corral.executors import process_folder, process_shim

log = logging.getLogger("corral.executors.process")

SUPERVISOR_DIED = "supervisor died before recording an exit"


@contextlib.contextmanager
def os_errors(doing: str) -> Iterator[None]:
    """Translate the operating system's errors into ExecutorError, keeping the cause."""
    try:
        yield
    except OSError as exc:
        raise errors.ExecutorError(f"process executor could not {doing}: {exc}") from exc


def check_same_identity(run_dir: Path, launch: launching.Launch) -> None:
    """Return if `run_dir` belongs to `launch`'s attempt, else raise LaunchConflict."""
    with os_errors(f"read the labels of {launch.name!r}"):
        theirs = read_json(run_dir / "labels.json") or {}
    mine, other = model.identity_from_labels(launch.labels), model.identity_from_labels(theirs)
    if mine == other and (mine is not None or dict(launch.labels) == theirs):
        return
    raise errors.LaunchConflict(
        f"launch name {launch.name!r} already exists for"
        f" {model.describe_identity(other, theirs)},"
        f" not for {model.describe_identity(mine, launch.labels)}"
    )


def observe_many(dirs: Mapping[str, Path]) -> dict[str, launching.Observation]:
    """Observations by name; a run folder that cannot be read is left out (unknown), so
    one damaged folder does not hide the others."""
    seen = {}
    for name, run_dir in dirs.items():
        try:
            seen[name] = observe_one(name, run_dir)
        except errors.ExecutorError as exc:
            log.warning("%s", exc)
    return seen


def observe_one(name: str, run_dir: Path) -> launching.Observation:
    with os_errors(f"observe {name!r}"):
        if not run_dir.is_dir():
            return launching.Observation(name=name, phase=launching.Phase.ABSENT)
        labels = read_json(run_dir / "labels.json") or {}
        finished = _finished(name, run_dir, labels)
        if finished is not None:
            return finished
        child = read_pid(run_dir / "child.pid")
        started_at = parse_time(child.get("started_at")) if child else None
        if alive(read_pid(run_dir / "shim.pid")):
            phase = launching.Phase.RUNNING if child else launching.Phase.PENDING
            return launching.Observation(name, phase, labels, started_at=started_at)
        if alive(child):  # the supervisor was killed, the command was not: it still runs
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
    record = read_json(run_dir / "exit.json")
    return None if record is None else from_record(name, run_dir, labels, record)


def from_record(
    name: str, run_dir: Path, labels: Mapping[str, str], record: Mapping[str, Any]
) -> launching.Observation:
    """What `exit.json` (`record`) says of a finished run; a failure's message is the last
    line of its stderr. Its output is the record's when the supervisor said it, else read
    from the folder."""
    succeeded = bool(record.get("succeeded", record.get("exit_code") == 0))
    said = record.get("output")
    started, finished = parse_time(record.get("started_at")), parse_time(record.get("finished_at"))
    output = run_log(
        said if isinstance(said, dict) else read_tails(run_dir, LOG_TAIL_BYTES),
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
        failure_class=None if succeeded else verdict(record),
        message=None if succeeded else _last_line(run_dir / "stderr.log"),
        output=output,
    )


LOG_TAIL_BYTES = launching.STREAM_BYTES
"""How much of each log is read back from a run folder whose end the supervisor did not
say (recovery, a sweep): the default, as the run folder does not record the setting."""


def read_tails(run_dir: Path, limit: int) -> dict[str, Any]:
    """What the supervisor says of a run's logs (process_shim.output_tails), read from its
    folder."""
    out = {}
    for name in process_folder.LOGS:
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


def verdict(record: Mapping[str, Any]) -> model.FailureClass | None:
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


def read_json(path: Path) -> Any:
    """The JSON in `path`, or None when there is no such file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise errors.ExecutorError(f"process executor found a damaged file {path}: {exc}") from exc


def read_pid(path: Path) -> Any:
    """A pid record, or None when there is none, or it is damaged: it is only written whole
    (a rename), so a damaged one is a power cut's, and no process outlives that."""
    try:
        return read_json(path)
    except errors.ExecutorError:
        return None


def parse_time(value: Any) -> datetime | None:
    try:
        at = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None
    return at if at is None or at.tzinfo is not None else at.replace(tzinfo=UTC)


def hour_end(hour: str) -> datetime:
    """When an hour of the ended index ends (its name is YYYYMMDDHH, in UTC); the far
    future for a name that is not one, so nothing is offered from it."""
    try:
        return datetime.strptime(hour, "%Y%m%d%H").replace(tzinfo=UTC) + timedelta(hours=1)
    except ValueError:
        return datetime.max.replace(tzinfo=UTC)


def has_exit(run_dir: Path) -> bool:
    return (run_dir / "exit.json").exists()


def is_run_dir(entry: os.DirEntry[str]) -> bool:
    return not entry.name.startswith(".") and entry.is_dir()


def matches_selector(run_dir: Path, selector: Mapping[str, str]) -> bool:
    try:
        labels = read_json(run_dir / "labels.json") or {}
    except errors.ExecutorError as exc:  # one damaged folder must not hide the others
        log.warning("%s", exc)
        return False
    return all(labels.get(key) == value for key, value in selector.items())


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time) of a live pid from /proc/<pid>/stat, or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = stat.rpartition(")")[2].split()
    return fields[0], int(fields[19])


def alive(record: Any) -> bool:
    """Whether the process in a `*.pid` record still runs (same pid AND same start time)."""
    if not isinstance(record, dict) or not isinstance(record.get("pid"), int):
        return False
    stat = proc_stat(record["pid"])
    if stat is None or stat[0] == "Z":
        return False
    return record.get("start_time") is None or stat[1] == record["start_time"]
