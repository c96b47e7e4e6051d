"""The process executor with real processes and real run folders (in pytest's tmp_path)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from corral import clock, errors, launching, model
from corral.executors import (
    base,
    process,
    process_child,
    process_folder,
    process_runs,
    process_shim,
    process_supervisor,
)
from corral.testing import FrozenClock
from tests.support import launches
from tests.support.launches import sh
from tests.support.procs import alive, kill_leftovers
from tests.support.wait import PATIENCE, eventually

pytestmark = pytest.mark.timeout(4 * PATIENCE)  # a test waits for at most four things

SRC = Path(__file__).resolve().parents[2] / "src"


def make_launch(
    name: str,
    command: Sequence[str],
    *,
    job_id: int = 1,
    attempt_no: int = 1,
    fence: int = 1,
    deadline_seconds: float | None = None,
    payload: Any = None,
    **spec: Any,
) -> launching.Launch:
    return launches.make_launch(
        "process",
        name,
        {"command": list(command), **spec},
        job_id=job_id,
        attempt_no=attempt_no,
        fence=fence,
        deadline_seconds=deadline_seconds,
        reach=launching.Reach(api_url="http://corral.test"),
        payload=payload,
    )


async def wait_for(
    ex: process.ProcessExecutor, name: str, *, finished: bool = True
) -> launching.Observation:
    """Poll until `name` is finished (or, with finished=False, running)."""

    async def there() -> launching.Observation | None:
        obs = (await ex.observe([name]))[name]
        wanted = obs.phase.finished if finished else obs.phase is launching.Phase.RUNNING
        return obs if wanted else None

    found: launching.Observation = await eventually(
        there, what=f"{name} {'finished' if finished else 'running'}"
    )
    return found


def run_folders(root: Path) -> list[str]:
    """The run folders in `root`, by name (not its indexes), after checking that no
    half-made launch folder was left behind."""
    assert not list((root / ".tmp").iterdir()), "a half-made launch folder was left"
    return sorted(p.name for p in root.iterdir() if not p.name.startswith("."))


@pytest.fixture
async def executor(tmp_path: Path) -> AsyncIterator[process.ProcessExecutor]:
    root = tmp_path / "runs"
    ex = process.ProcessExecutor(root=root, clock=clock.SystemClock(), poll_interval=0.05)
    await ex.start()
    yield ex
    await ex.close()
    kill_leftovers(ex.root)


def test_it_is_an_executor(executor: process.ProcessExecutor) -> None:
    assert isinstance(executor, base.Executor)
    assert executor.kind == "process"


async def test_success(executor: process.ProcessExecutor) -> None:
    await executor.launch(make_launch("ok-1", sh("echo hello")))
    obs = await wait_for(executor, "ok-1")
    assert obs.phase is launching.Phase.SUCCEEDED
    assert obs.exit_code == 0
    assert obs.identity == model.Identity(1, 1, 1)
    assert obs.started_at is not None
    assert obs.finished_at is not None
    assert obs.started_at.tzinfo is not None
    assert obs.finished_at >= obs.started_at
    assert (executor.root / "ok-1" / "stdout.log").read_text() == "hello\n"


async def test_failure_keeps_stderr(executor: process.ProcessExecutor) -> None:
    await executor.launch(make_launch("bad-1", sh("echo oops >&2; exit 3")))
    obs = await wait_for(executor, "bad-1")
    assert obs.phase is launching.Phase.FAILED
    assert obs.exit_code == 3
    assert obs.reason == "exited with code 3"
    assert (executor.root / "bad-1" / "stderr.log").read_text() == "oops\n"


async def test_command_that_cannot_start_fails(executor: process.ProcessExecutor) -> None:
    await executor.launch(make_launch("nope-1", ["/no/such/program"]))
    obs = await wait_for(executor, "nope-1")
    assert obs.phase is launching.Phase.FAILED
    assert obs.reason is not None
    assert "could not start" in obs.reason


async def test_env_and_cwd(
    executor: process.ProcessExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CORRAL_DATABASE_URL", "postgresql+psycopg://secret@db/corral")
    script = (
        'echo "$CORRAL_JOB_ID $CORRAL_FENCE $CORRAL_LAUNCH_NAME $CORRAL_API_URL $CORRAL_TENANT'
        ' $MINE [$CORRAL_DATABASE_URL] $CORRAL_RUN_DIR" > out'
    )
    launch = make_launch("env-1", sh(script), env={"MINE": "yes"}, cwd=str(tmp_path))
    await executor.launch(launch)
    assert (await wait_for(executor, "env-1")).phase is launching.Phase.SUCCEEDED
    # corral's own settings are not passed on to the job
    run_dir = executor.root / "env-1"
    assert (tmp_path / "out").read_text() == f"1 1 env-1 http://corral.test acme yes [] {run_dir}\n"


async def test_a_command_gets_its_three_descriptors_and_default_signals(
    executor: process.ProcessExecutor,
) -> None:
    """Nothing of the supervisor's leaks into a command: no descriptor but stdin, stdout
    and stderr (the socket to corral included), and SIGPIPE and SIGXFSZ at their defaults
    (Python ignores them, and an ignored signal stays ignored across exec)."""
    # The signals as the shell has them (a Python command ignores both itself, as every
    # Python does), then the descriptors as the same process has them after an exec.
    listing = "import os; print(*sorted(int(fd) for fd in os.listdir('/proc/self/fd'))[:-1])"
    script = f'grep SigIgn /proc/$$/status; exec {sys.executable} -c "{listing}"'
    await executor.launch(make_launch("fds-1", sh(script)))
    assert (await wait_for(executor, "fds-1")).phase is launching.Phase.SUCCEEDED
    ignored, fds = (executor.root / "fds-1" / "stdout.log").read_text().splitlines()
    assert fds == "0 1 2"  # and the one that listed them, last, left out
    mask = int(ignored.split()[1], 16)
    assert not mask & (1 << (signal.SIGPIPE - 1) | 1 << (signal.SIGXFSZ - 1))


async def test_a_command_is_found_in_its_own_path(
    executor: process.ProcessExecutor, tmp_path: Path
) -> None:
    tool = tmp_path / "bin" / "corral-test-tool"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\necho found me\n")
    tool.chmod(0o755)
    path = f"{tool.parent}:{os.defpath}"
    await executor.launch(make_launch("path-1", [tool.name], env={"PATH": path}))
    await executor.launch(make_launch("path-2", [tool.name], job_id=2))  # not in corral's PATH
    assert (await wait_for(executor, "path-1")).phase is launching.Phase.SUCCEEDED
    assert (executor.root / "path-1" / "stdout.log").read_text() == "found me\n"
    missing = await wait_for(executor, "path-2")
    assert missing.phase is launching.Phase.FAILED
    assert missing.reason == (
        f"{process_shim.START_FAILED}: [Errno 2] No such file or directory: '{tool.name}'"
    )


async def test_launch_twice_runs_once(executor: process.ProcessExecutor, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    launch = make_launch("twice-1", sh(f"echo run >> {marks}"))
    await asyncio.gather(*(executor.launch(launch) for _ in range(5)))  # racing shims
    await executor.launch(launch)  # the folder is there already
    assert (await wait_for(executor, "twice-1")).phase is launching.Phase.SUCCEEDED
    assert marks.read_text() == "run\n"
    assert run_folders(executor.root) == ["twice-1"]


RACER = textwrap.dedent(
    """
    import asyncio, sys, time
    from pathlib import Path
    from corral import clock, launching, model
    from corral.executors import process

    root, marks, ready, go = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])

    async def main():
        ex = process.ProcessExecutor(root=root, clock=clock.SystemClock())
        await ex.start()
        ready.touch()
        while not go.exists():
            time.sleep(0.001)
        for i in range(4):
            name = f"race-{i}"
            labels = model.identity_labels(job_id=i, attempt_no=1, fence=i, tenant="t",
                                           capability="c", idempotency_key=None)
            await ex.launch(launching.Launch(
                name=name, job_id=i, attempt_no=1, fence=i, tenant="t", executor="process",
                spec={"command": ["sh", "-c", f"echo run >> {marks}/{name}"]}, payload=None,
                labels=labels, env=launching.attempt_env(labels, name=name, tenant="t", reach=launching.Reach())))
        await ex.close()

    asyncio.run(main())
    """
)


async def test_two_os_processes_launching_one_name_start_one_run(
    executor: process.ProcessExecutor, tmp_path: Path
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    go = tmp_path / "go"
    ready = [tmp_path / f"ready-{i}" for i in range(4)]
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    racers = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-c", RACER, str(executor.root), str(marks), str(r), str(go), env=env
        )
        for r in ready
    ]
    # All four have imported corral and started their executor: they go together.
    await eventually(lambda: all(r.exists() for r in ready), what="the racers at the start")
    go.touch()
    codes = [await asyncio.wait_for(racer.wait(), PATIENCE) for racer in racers]
    assert codes == [0, 0, 0, 0]
    names = [f"race-{i}" for i in range(4)]
    for name in names:
        assert (await wait_for(executor, name)).phase is launching.Phase.SUCCEEDED
        assert (marks / name).read_text() == "run\n"
    assert run_folders(executor.root) == names


async def test_same_name_other_identity_conflicts(executor: process.ProcessExecutor) -> None:
    await executor.launch(make_launch("name-1", ["true"], fence=1))
    with pytest.raises(errors.LaunchConflict, match=r"fence 1.*fence 2"):
        await executor.launch(make_launch("name-1", ["true"], fence=2))


async def test_restart_survival(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    gate = tmp_path / "go"
    a = process.ProcessExecutor(root=root, clock=clock.SystemClock())
    await a.start()
    await a.launch(make_launch("long-1", sh(f"while [ ! -e {gate} ]; do sleep 0.05; done")))
    await wait_for(a, "long-1", finished=False)
    await a.close()
    del a

    b = process.ProcessExecutor(root=root, clock=clock.SystemClock())
    await b.start()
    try:
        running = (await b.observe(["long-1"]))["long-1"]
        assert running.phase is launching.Phase.RUNNING
        assert running.identity == model.Identity(1, 1, 1)
        assert [o.name for o in await b.list_managed({model.JOB_ID: "1"})] == ["long-1"]
        gate.touch()
        done = await wait_for(b, "long-1")
        assert done.phase is launching.Phase.SUCCEEDED
    finally:
        await b.close()
        kill_leftovers(root)


async def test_list_managed_by_selector(executor: process.ProcessExecutor) -> None:
    await executor.launch(make_launch("sel-1", ["true"], job_id=1))
    await executor.launch(make_launch("sel-2", ["true"], job_id=2))
    await executor.launch(make_launch("sel-3", ["true"], job_id=2, attempt_no=2, fence=3))
    mine = await executor.list_managed({model.JOB_ID: "2"})
    assert sorted(o.name for o in mine) == ["sel-2", "sel-3"]
    assert all(o.identity is not None and o.identity.job_id == 2 for o in mine)
    everything = await executor.list_managed({model.MANAGED_BY: model.MANAGER})
    assert len(everything) == 3
    assert await executor.list_managed({"other": "x"}) == []


async def test_observe_absent(executor: process.ProcessExecutor) -> None:
    obs = await executor.observe(["never-1"])
    assert obs == {"never-1": launching.Observation("never-1", launching.Phase.ABSENT)}


async def test_a_damaged_pid_record_reads_as_none(executor: process.ProcessExecutor) -> None:
    """Pid records are not synced: a power cut may leave one torn. It reads as no record (no
    process outlives a power cut), never as a folder that cannot be observed."""
    await executor.launch(make_launch("torn-1", ["true"]))
    await wait_for(executor, "torn-1")
    run_dir = executor.root / "torn-1"
    (run_dir / "exit.json").unlink()  # as if the power went before the end was recorded
    for name in ("shim.pid", "child.pid"):
        (run_dir / name).write_text('{"pid": ')
    obs = (await executor.observe(["torn-1"]))["torn-1"]
    assert (obs.phase, obs.reason) == (launching.Phase.FAILED, process_runs.SUPERVISOR_DIED)


async def test_a_closed_executor_launches_nothing(tmp_path: Path) -> None:
    ex = process.ProcessExecutor(root=tmp_path / "runs", clock=clock.SystemClock())
    await ex.start()
    await ex.close()
    with pytest.raises(errors.ExecutorError, match="closed"):
        await ex.launch(make_launch("late-1", ["true"]))
    assert ex.supervisor_pid is None, "no supervisor started for it"
    assert run_folders(ex.root) == []


@pytest.mark.parametrize(
    ("reason", "verdict"),
    [
        (f"{process_shim.NO_RESOURCES}: [Errno 24] Too many open files", "transient"),
        (f"{process_shim.START_FAILED}: [Errno 2] No such file or directory", "permanent"),
    ],
)
def test_a_command_that_cannot_start_fails_for_good_unless_the_machine_was_short(
    reason: str, verdict: str
) -> None:
    record = {"exit_code": process_shim.START_FAILED_EXIT_CODE, "reason": reason}
    assert process_runs.verdict(record) == model.FailureClass(verdict)


async def test_cancel(executor: process.ProcessExecutor) -> None:
    await executor.launch(make_launch("cancel-1", ["sleep", "30"]))
    await wait_for(executor, "cancel-1", finished=False)
    await executor.cancel("cancel-1", timedelta(seconds=5))
    obs = await wait_for(executor, "cancel-1")
    assert obs.phase is launching.Phase.FAILED
    assert obs.reason is not None
    assert "cancelled" in obs.reason
    assert obs.exit_code == -signal.SIGTERM


async def test_cancel_kills_what_ignores_sigterm(executor: process.ProcessExecutor) -> None:
    await executor.launch(make_launch("stubborn-1", sh("trap '' TERM; echo ready; sleep 30")))
    out = executor.root / "stubborn-1" / "stdout.log"
    await eventually(lambda: out.exists() and out.read_text() == "ready\n", what="the trap set")
    began = time.monotonic()
    await executor.cancel("stubborn-1", timedelta(seconds=0.5))
    obs = await wait_for(executor, "stubborn-1")
    assert time.monotonic() - began >= 0.5
    assert obs.phase is launching.Phase.FAILED
    assert obs.reason is not None
    assert "cancelled" in obs.reason
    assert obs.exit_code == -signal.SIGKILL


async def test_cancel_absent_or_finished_is_a_noop(executor: process.ProcessExecutor) -> None:
    await executor.cancel("never-1", timedelta(seconds=1))
    await executor.launch(make_launch("done-1", ["true"]))
    await wait_for(executor, "done-1")
    await executor.cancel("done-1", timedelta(seconds=1))
    assert (await executor.observe(["done-1"]))["done-1"].phase is launching.Phase.SUCCEEDED
    assert not (executor.root / "done-1" / "cancel").exists()


async def test_deadline(executor: process.ProcessExecutor) -> None:
    await executor.launch(make_launch("late-1", ["sleep", "30"], deadline_seconds=0.5))
    obs = await wait_for(executor, "late-1")
    assert obs.phase is launching.Phase.FAILED
    assert obs.reason == "deadline exceeded"
    assert obs.exit_code == -signal.SIGTERM


async def test_past_the_deadline_what_ignores_sigterm_is_killed_after_the_grace(
    tmp_path: Path,
) -> None:
    ex = process.ProcessExecutor(root=tmp_path / "runs", clock=clock.SystemClock(), kill_grace=0.5)
    await ex.start()
    script = sh("trap '' TERM; sleep 30")
    await ex.launch(make_launch("stubborn-late", script, deadline_seconds=2))  # sh is up by then
    obs = await wait_for(ex, "stubborn-late")
    assert (obs.phase, obs.reason, obs.exit_code) == (
        launching.Phase.FAILED,
        "deadline exceeded",
        -signal.SIGKILL,
    )
    assert obs.started_at is not None
    assert obs.finished_at is not None
    ran = (obs.finished_at - obs.started_at).total_seconds()
    assert ran < 2 + 10, "killed after the configured grace (0.5s), not the 10s default"
    await ex.close()


async def test_the_first_launches_share_one_supervisor_started_off_the_loop(
    executor: process.ProcessExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launches of a first tick all wait for the one supervisor being started, and the
    loop goes on meanwhile (an interpreter's start may take longer than a tick's deadline,
    and the other launches of the tick must have their turn before it). The start is made
    a second slower than it is, so a loop held by it would stand still that long: far
    more than a loaded machine's pauses."""
    start = process_supervisor._start_supervisor

    def slow_start(log: Path) -> Any:
        time.sleep(1.0)
        return start(log)

    monkeypatch.setattr(process_supervisor, "_start_supervisor", slow_start)
    gaps: list[float] = []

    async def beat() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    beating = asyncio.create_task(beat())
    names = [f"first-{i}" for i in range(1, 6)]
    t0 = time.monotonic()
    try:
        await asyncio.gather(
            *(executor.launch(make_launch(n, ["true"], fence=i)) for i, n in enumerate(names, 1))
        )
    finally:
        beating.cancel()
    took = time.monotonic() - t0  # mostly the supervisor's start
    assert took >= 1.0
    assert max(gaps) < 0.5, f"the loop stood still {max(gaps):.3f}s of {took:.3f}s"
    for name in names:
        await wait_for(executor, name)
    pids = {json.loads((executor.root / n / "shim.pid").read_text())["pid"] for n in names}
    assert pids == {executor.supervisor_pid}


async def test_a_supervisor_that_fails_to_start_fails_every_waiting_launch_and_no_later_one(
    executor: process.ProcessExecutor, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Every launch waiting on a start that fails is told so (recovery tries them again);
    the next launch starts a supervisor of its own."""
    broken = tmp_path / "no_such_shim.py"
    monkeypatch.setattr(process_supervisor, "SHIM", broken)
    launches = [executor.launch(make_launch(f"early-{i}", ["true"], fence=i)) for i in (1, 2, 3)]
    failed = await asyncio.gather(*launches, return_exceptions=True)
    assert all(isinstance(e, errors.ExecutorError) for e in failed), failed
    assert all("did not start" in str(e) for e in failed), failed
    assert executor.supervisor_pid is None
    monkeypatch.undo()
    await executor.launch(make_launch("later-4", ["true"], fence=4))
    assert (await wait_for(executor, "later-4")).phase is launching.Phase.SUCCEEDED


async def test_supervisor_killed(executor: process.ProcessExecutor) -> None:
    await executor.launch(make_launch("orphan-1", ["sleep", "30"]))
    await wait_for(executor, "orphan-1", finished=False)
    run_dir = executor.root / "orphan-1"
    os.kill(json.loads((run_dir / "shim.pid").read_text())["pid"], signal.SIGKILL)
    os.killpg(json.loads((run_dir / "child.pid").read_text())["pid"], signal.SIGKILL)
    obs = await wait_for(executor, "orphan-1")
    assert obs.phase is launching.Phase.FAILED
    assert obs.reason is not None
    assert obs.reason.startswith("supervisor died")
    assert obs.exit_code is None
    assert obs.identity == model.Identity(1, 1, 1)


async def test_a_command_outliving_its_killed_supervisor_is_still_running(
    executor: process.ProcessExecutor,
) -> None:
    await executor.launch(make_launch("orphan-2", ["sleep", "30"]))
    await wait_for(executor, "orphan-2", finished=False)
    run_dir = executor.root / "orphan-2"
    os.kill(json.loads((run_dir / "shim.pid").read_text())["pid"], signal.SIGKILL)

    async def told() -> launching.Observation | None:
        obs = (await executor.observe(["orphan-2"]))["orphan-2"]
        return obs if obs.reason else None

    obs = await eventually(told, what="the supervisor's death seen")
    assert obs.phase is launching.Phase.RUNNING, (
        "the work goes on; it must not be retried beside itself"
    )
    assert obs.reason is not None
    assert obs.reason.startswith("supervisor died")
    await executor.cancel("orphan-2", timedelta(seconds=0.2))  # cancel still reaches it
    obs = await wait_for(executor, "orphan-2")
    assert obs.phase is launching.Phase.FAILED


async def test_one_damaged_run_folder_does_not_hide_the_others(
    executor: process.ProcessExecutor,
) -> None:
    await executor.launch(make_launch("good-1", ["true"]))
    await executor.launch(make_launch("bad-1", ["true"], job_id=2))
    await wait_for(executor, "good-1")
    (executor.root / "bad-1" / "labels.json").write_text("{not json")
    seen = await executor.observe(["good-1", "bad-1"])
    assert seen["good-1"].phase is launching.Phase.SUCCEEDED
    assert "bad-1" not in seen  # unknown, not absent: nothing may relaunch it


async def test_events_yield_finishes(executor: process.ProcessExecutor) -> None:
    await executor.launch(make_launch("ev-1", ["true"]))
    await executor.launch(make_launch("ev-2", sh("exit 4"), job_id=2))
    seen: dict[str, launching.Observation] = {}
    async with contextlib.aclosing(executor.events()) as events:
        async for obs in events:
            seen[obs.name] = obs
            if len(seen) == 2:
                break
    assert seen["ev-1"].phase is launching.Phase.SUCCEEDED
    assert seen["ev-2"].phase is launching.Phase.FAILED
    assert seen["ev-2"].exit_code == 4


async def test_a_finish_reaches_events_when_its_shim_ends_not_at_a_poll(tmp_path: Path) -> None:
    """The spawner says when a shim ended, so `events` needs no poll of the run folders:
    with a poll interval of an hour the finish still comes at once."""
    ex = process.ProcessExecutor(
        root=tmp_path / "runs", clock=clock.SystemClock(), poll_interval=3600
    )
    await ex.start()
    try:
        async with contextlib.aclosing(ex.events()) as events:
            await ex.launch(make_launch("push-1", sh("exit 5")))
            obs = await asyncio.wait_for(anext(events), PATIENCE)
        assert (obs.name, obs.phase, obs.exit_code) == ("push-1", launching.Phase.FAILED, 5)
    finally:
        await ex.close()
        kill_leftovers(ex.root)


async def test_a_sweep_while_a_launch_is_asked_does_not_drop_its_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep (every run watched, read from its folder) that comes between a launch's
    request and its answer finds no folder yet: that is no finish, and the finish the
    supervisor tells later still comes at once, not at the dispatcher's next poll."""
    monkeypatch.setattr(process, "SWEEP_EVERY", 1)  # a sweep every poll interval
    ex = process.ProcessExecutor(
        root=tmp_path / "runs", clock=clock.SystemClock(), poll_interval=0.05
    )
    await ex.start()
    asked, answer_now, swept = asyncio.Event(), asyncio.Event(), asyncio.Event()
    supervise, observe = ex._supervisor.supervise, ex.observe

    async def held_supervise(*args: Any, **kwargs: Any) -> str:
        asked.set()
        await answer_now.wait()
        return await supervise(*args, **kwargs)

    async def watched_observe(names: Sequence[str]) -> dict[str, launching.Observation]:
        seen = await observe(names)
        if "held-1" in names:
            swept.set()
        return seen

    monkeypatch.setattr(ex._supervisor, "supervise", held_supervise)
    monkeypatch.setattr(ex, "observe", watched_observe)
    try:
        async with contextlib.aclosing(ex.events()) as events:
            launch_task = asyncio.create_task(ex.launch(make_launch("held-1", ["true"])))
            await asyncio.wait_for(asked.wait(), PATIENCE)
            first = asyncio.ensure_future(anext(events))
            await asyncio.wait_for(swept.wait(), PATIENCE)
            answer_now.set()
            await asyncio.wait_for(launch_task, PATIENCE)
            obs = await asyncio.wait_for(first, PATIENCE)
        assert (obs.name, obs.phase) == ("held-1", launching.Phase.SUCCEEDED)
    finally:
        await ex.close()
        kill_leftovers(ex.root)


async def test_a_killed_supervisor_is_started_again_and_its_commands_go_on(
    executor: process.ProcessExecutor,
) -> None:
    await executor.launch(make_launch("before-1", ["sleep", "300"]))
    shim, child = await started(executor, "before-1", "sleep")
    assert shim == executor.supervisor_pid, "one supervisor for every run of the executor"
    os.kill(shim, signal.SIGKILL)
    await wait_gone([shim])
    await executor.launch(make_launch("after-1", ["true"], job_id=2))  # a new supervisor
    assert (await wait_for(executor, "after-1")).phase is launching.Phase.SUCCEEDED
    assert executor.supervisor_pid not in (None, shim)
    assert alive(child), "a command outlives its supervisor"
    obs = (await executor.observe(["before-1"]))["before-1"]
    assert (obs.phase, obs.reason) == (launching.Phase.RUNNING, process_runs.SUPERVISOR_DIED)


async def test_a_supervisor_stopped_with_sigterm_stops_its_commands_and_another_takes_over(
    executor: process.ProcessExecutor,
) -> None:
    await executor.launch(make_launch("stopped-1", ["sleep", "300"]))
    shim, _ = await started(executor, "stopped-1", "sleep")
    os.kill(shim, signal.SIGTERM)  # a shutdown: it stops what it runs, and says why
    obs = await wait_for(executor, "stopped-1")
    assert (obs.phase, obs.reason) == (launching.Phase.FAILED, "supervisor terminated")
    assert obs.failure_class is model.FailureClass.TRANSIENT
    await executor.launch(make_launch("next-1", ["true"], job_id=2))
    assert (await wait_for(executor, "next-1")).phase is launching.Phase.SUCCEEDED
    assert executor.supervisor_pid not in (None, shim)


async def test_events_end_on_close(executor: process.ProcessExecutor) -> None:
    async def drain() -> list[launching.Observation]:
        return [obs async for obs in executor.events()]

    task = asyncio.create_task(drain())
    await asyncio.sleep(0)  # one turn of the loop: drain is now waiting inside events()
    assert not task.done()
    await executor.close()
    assert await asyncio.wait_for(task, PATIENCE) == []


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"command": []}, "command"),
        ({"command": ["", "x"]}, "command"),
        ({"command": "echo hi"}, "command"),
        ({}, "command"),
        ({"command": ["true"], "image": "x"}, "image"),
        ({"command": ["true"], "env": {"A": 1}}, "env"),
        ({"command": ["true"], "cwd": ""}, "cwd"),
        ({"command": ["echo", "a\0b"]}, "command"),
        ({"command": ["true"], "env": {"A": "x\0"}}, "env"),
        ({"command": ["true"], "cwd": "/tmp\0"}, "cwd"),
    ],
)
def test_validate_spec_refuses(
    executor: process.ProcessExecutor, spec: dict[str, Any], field: str
) -> None:
    with pytest.raises(errors.InvalidInput, match=f"^process spec: {field}: "):
        executor.validate_spec(spec)


def test_validate_spec_normalises(executor: process.ProcessExecutor) -> None:
    spec = {"command": ("echo", "hi"), "env": {"A": "1"}}
    assert executor.validate_spec(spec) == {"command": ["echo", "hi"], "env": {"A": "1"}}
    assert executor.validate_spec({"command": ["grep", "", "f"]}) == {"command": ["grep", "", "f"]}
    with pytest.raises(errors.InvalidInput, match="must be a non-empty list of strings"):
        executor.validate_spec({"command": []})


async def test_bad_launch_name_is_refused(executor: process.ProcessExecutor) -> None:
    with pytest.raises(errors.InvalidInput):
        await executor.launch(make_launch("../escape", ["true"]))


async def test_a_missing_root_is_an_error_not_absent(tmp_path: Path) -> None:
    ex = process.ProcessExecutor(root=tmp_path / "runs", clock=clock.SystemClock())
    await ex.start()
    shutil.rmtree(tmp_path / "runs")
    with pytest.raises(errors.ExecutorError, match="missing"):
        await ex.observe(["corral-1-1"])
    with pytest.raises(errors.ExecutorError, match="missing"):
        await ex.list_managed({})
    with pytest.raises(errors.ExecutorError, match="missing"):
        await ex.list_live({})
    with pytest.raises(errors.ExecutorError, match="missing"):
        await ex.list_ended(datetime.now(UTC))


async def test_old_finished_runs_are_forgotten_only_once_the_store_holds_them_ended(
    tmp_path: Path,
) -> None:
    """Like a Kubernetes Job's TTL after finished, but safe across a long outage: the
    reconciler removes a run folder past the retention only when its attempt has ended in
    the store; one recovery has yet to read stays, as do running ones."""
    from datetime import UTC, datetime, timedelta

    from corral import config, reconciler, store
    from corral.store import Finish

    db = store.Store.connect(f"sqlite:///{tmp_path}/c.db")
    await db.database.migrate()
    later = FrozenClock(datetime.now(UTC) + timedelta(days=8))
    ex = process.ProcessExecutor(root=tmp_path / "runs", clock=later, poll_interval=0.05)
    assert isinstance(ex, base.Forgets)
    assert ex.retention == timedelta(days=7)
    await ex.start()
    try:
        await db.jobs.submit(new=[model.NewJob(executor="process", spec={})] * 3, now=later.now())
        done, unread, busy = await db.jobs.claim(now=later.now(), limit=3, executors=["process"])
        scripts = [(done, "true"), (unread, "true"), (busy, "sleep 30")]
        for c, script in scripts:
            launch = launching.build_launch(c, reach=launching.Reach(), deadline_seconds=None)
            await ex.launch(dataclasses.replace(launch, spec={"command": ["sh", "-c", script]}))
        fences = [c.attempt.id for c, _ in scripts]
        await db.attempts.record_running(fences=fences, now=later.now())
        await wait_for(ex, done.attempt.launch_name)
        await wait_for(ex, unread.attempt.launch_name)
        await db.attempts.finish(
            finishes=[Finish(done.attempt.id, model.AttemptState.SUCCEEDED, 0, None)],
            now=later.now(),
        )
        (ex.root / ".tmp" / "crashed-1-abc").mkdir()
        os.utime(ex.root / ".tmp" / "crashed-1-abc", (0, 0))
        r = reconciler.Reconciler(
            store=db, executors={"process": ex}, clock=later, settings=config.Settings()
        )
        assert (await r.run_once()).forgotten == 1
        left = run_folders(ex.root)  # and the half-made folder went
        assert left == sorted([unread.attempt.launch_name, busy.attempt.launch_name])
        await ex.forget([busy.attempt.launch_name])
        assert (ex.root / busy.attempt.launch_name).is_dir(), "never a run still going"
    finally:
        kill_leftovers(ex.root)
        await ex.close()
        await db.close()


# --- the indexes of live and ended runs ------------------------------------------------------


def indexed(root: Path) -> tuple[list[str], list[str]]:
    """The names in the live index, and those in the ended one (any hour)."""
    live = sorted(p.name for p in (root / ".live").iterdir())
    ended = sorted(p.name for hour in (root / ".ended").iterdir() for p in hour.iterdir())
    return live, ended


@pytest.fixture
def observed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of every run folder the executor reads, as they are read."""
    names: list[str] = []
    real = process_runs.observe_one

    def counting(name: str, run_dir: Path) -> launching.Observation:
        names.append(name)
        return real(name, run_dir)

    monkeypatch.setattr(process_runs, "observe_one", counting)
    return names


async def test_each_run_moves_from_the_live_index_to_its_hour_when_it_ends(
    executor: process.ProcessExecutor,
) -> None:
    await executor.launch(make_launch("quick-1", ["true"], fence=1))
    await executor.launch(make_launch("long-2", ["sleep", "300"], fence=2))
    await wait_for(executor, "quick-1")
    await eventually(lambda: indexed(executor.root) == (["long-2"], ["quick-1"]), what="moved")
    hour = process_folder.hour_of(time.time())
    assert (executor.root / ".ended" / hour / "quick-1").is_file()
    assert [o.name for o in await executor.list_live({})] == ["long-2"]
    await executor.cancel("long-2", timedelta(seconds=5))
    await wait_for(executor, "long-2")
    await eventually(lambda: indexed(executor.root) == ([], ["long-2", "quick-1"]), what="both")
    assert await executor.list_live({}) == []


async def test_a_pass_reads_the_live_runs_and_no_finished_one(
    tmp_path: Path, observed: list[str]
) -> None:
    """However many finished runs the root keeps, the reconciler's pass reads only those
    that may still go on (and, to forget them, those older than the retention)."""
    from corral import config, reconciler, store

    db = store.Store.connect(f"sqlite:///{tmp_path}/c.db")
    await db.database.migrate()
    ex = process.ProcessExecutor(root=tmp_path / "runs", clock=clock.SystemClock())
    await ex.start()
    try:
        for i in range(1, 31):
            await ex.launch(make_launch(f"done-{i}", ["true"], fence=i))
        await ex.launch(make_launch("long-99", ["sleep", "300"], fence=99))
        for i in range(1, 31):
            await wait_for(ex, f"done-{i}")
        await eventually(lambda: indexed(ex.root)[0] == ["long-99"], what="all but one ended")
        r = reconciler.Reconciler(
            store=db,
            executors={"process": ex},
            clock=clock.SystemClock(),
            settings=config.Settings(),
        )
        observed.clear()
        await r.run_once()
        assert observed == ["long-99"]
        assert len(await ex.list_managed({})) == 31, "the whole history is still there"
    finally:
        await ex.close()
        kill_leftovers(ex.root)
        await db.close()


async def test_missing_indexes_are_rebuilt_from_the_run_folders(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    first = process.ProcessExecutor(root=root, clock=clock.SystemClock(), poll_interval=0.05)
    await first.start()
    try:
        await first.launch(make_launch("done-1", ["true"], fence=1))
        await first.launch(make_launch("long-2", ["sleep", "300"], fence=2))
        await wait_for(first, "done-1")
        await first.close()
        for index in (".live", ".ended", ".indexed"):
            path = root / index
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        (root / ".tmp-old-3-abc").mkdir()  # half-made by an earlier version, in the root
        os.utime(root / ".tmp-old-3-abc", (0, 0))
        later = FrozenClock(datetime.now(UTC) + timedelta(days=8))
        second = process.ProcessExecutor(root=root, clock=later)
        await second.start()
        assert indexed(root) == (["long-2"], ["done-1"])
        assert run_folders(root) == ["done-1", "long-2"], "only the half-made one went"
        assert [o.name for o in await second.list_live({})] == ["long-2"]
        assert [o.name for o in await second.list_ended(later.now() - second.retention)] == [
            "done-1"
        ]
        await second.close()
    finally:
        kill_leftovers(root)


async def test_a_live_index_deleted_under_a_running_executor_is_made_again(
    executor: process.ProcessExecutor,
) -> None:
    await executor.launch(make_launch("long-1", ["sleep", "300"]))
    await wait_for(executor, "long-1", finished=False)
    shutil.rmtree(executor.root / ".live")
    assert [o.name for o in await executor.list_live({})] == ["long-1"]
    assert indexed(executor.root)[0] == ["long-1"]


async def test_stale_markers_are_mended_where_they_are_found(
    executor: process.ProcessExecutor,
) -> None:
    """A supervisor killed between recording an exit and moving its marker, a launch that
    failed after marking its name, a name launched again after it was forgotten."""
    await executor.launch(make_launch("done-1", ["true"]))
    await wait_for(executor, "done-1")
    await eventually(lambda: indexed(executor.root) == ([], ["done-1"]), what="ended")
    root = executor.root
    process_folder.mark_live(root, "done-1")
    process_folder.mark_live(root, "never-2")
    assert await executor.list_live({}) == []
    assert indexed(root) == (["never-2"], ["done-1"]), "ended moved; absent kept for one look"
    assert await executor.list_live({}) == []
    assert indexed(root) == ([], ["done-1"]), "still no folder a look later: removed"

    shutil.rmtree(root / "done-1")
    await executor.launch(make_launch("done-1", ["sleep", "300"]))
    await wait_for(executor, "done-1", finished=False)
    far = datetime.now(UTC) + timedelta(days=1)
    assert await executor.list_ended(far) == []
    assert indexed(root) == (["done-1"], []), "running again: back in the live index"


async def test_old_ended_runs_are_offered_a_batch_at_a_time(
    executor: process.ProcessExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(process, "FORGET_BATCH", 2)
    for i in range(1, 6):
        await executor.launch(make_launch(f"done-{i}", ["true"], fence=i))
    for i in range(1, 6):
        await wait_for(executor, f"done-{i}")
    await eventually(lambda: len(indexed(executor.root)[1]) == 5, what="all ended")
    far = datetime.now(UTC) + timedelta(days=1)
    assert await executor.list_ended(datetime.now(UTC) - timedelta(hours=1)) == []
    offers = [sorted(o.name for o in await executor.list_ended(far)) for _ in range(4)]
    assert offers == [["done-1", "done-2"], ["done-3", "done-4"], ["done-5"], ["done-1", "done-2"]]
    await executor.forget(["done-1", "done-2"])
    assert indexed(executor.root)[1] == ["done-3", "done-4", "done-5"], "markers go with them"
    assert sorted(o.name for o in await executor.list_ended(far)) == ["done-3", "done-4"]


# --- a run folder that disappears under a running command ----------------------------------------

IGNORES_TERM = sh("trap '' TERM; exec sleep 300")
"""One process (the ignored SIGTERM survives the exec) that only SIGKILL stops."""

WAITER = textwrap.dedent(
    """
    import os, sys, time
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.05)
    sys.exit(3)
    """
)


def waiter(go: Path) -> list[str]:
    """A command of one process that exits with code 3 once `go` exists."""
    return [sys.executable, "-c", WAITER, str(go)]


def pid_of(run_dir: Path, pid_file: str) -> int:
    pid: int = json.loads((run_dir / pid_file).read_text())["pid"]
    return pid


def processes_of(run_dir: Path) -> list[int]:
    """The live pids whose environment names `run_dir` as their CORRAL_RUN_DIR."""
    mark = f"CORRAL_RUN_DIR={run_dir}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if mark in environ.split(b"\0") and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


async def wait_gone(pids: Sequence[int]) -> None:
    await eventually(lambda: not any(alive(pid) for pid in pids), what=f"{list(pids)} gone")


async def started(ex: process.ProcessExecutor, name: str, command: str) -> tuple[int, int]:
    """(shim pid, command pid) once `name` runs and its command has become `command`."""
    await wait_for(ex, name, finished=False)
    run_dir = ex.root / name
    child = pid_of(run_dir, "child.pid")
    await eventually(
        lambda: Path(f"/proc/{child}/cmdline").read_bytes().startswith(command.encode()),
        what=f"{name}: the command become {command!r}",
    )
    return pid_of(run_dir, "shim.pid"), child


@pytest.fixture
async def patient(tmp_path: Path) -> AsyncIterator[process.ProcessExecutor]:
    """An executor whose shims give a command a minute between SIGTERM and SIGKILL: longer
    than any test waits, so whatever stops a command that ignores SIGTERM is not its shim."""
    ex = process.ProcessExecutor(
        root=tmp_path / "patient", clock=clock.SystemClock(), poll_interval=0.05, kill_grace=60
    )
    await ex.start()
    yield ex
    await ex.close()
    kill_leftovers(ex.root)


def open_paths(pid: int) -> list[str]:
    """What the process `pid` holds open, as /proc shows it."""
    found = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            found.append(str(fd.readlink()))
    return found


async def let_go(pid: int, folders: Sequence[Path]) -> None:
    """Until the process `pid` holds none of `folders`, nor anything in them, open."""
    prefixes = tuple(f"{folder}{end}" for folder in folders for end in ("/", " (deleted)"))
    await eventually(
        lambda: not any(p.startswith(prefixes) or p in map(str, folders) for p in open_paths(pid)),
        what=f"{pid} holds nothing in {list(map(str, folders))}",
    )


def relaunch_of(launch: launching.Launch) -> launching.Launch:
    return dataclasses.replace(launch, relaunch=True)


@pytest.mark.parametrize("how", ["removed", "replaced"])
@pytest.mark.parametrize("command", [["sleep", "300"], IGNORES_TERM], ids=["term", "kill"])
async def test_a_command_whose_run_folder_goes_is_stopped_and_nothing_is_written(
    tmp_path: Path, how: str, command: list[str]
) -> None:
    ex = process.ProcessExecutor(
        root=tmp_path / "runs", clock=clock.SystemClock(), poll_interval=0.05, kill_grace=0.5
    )
    await ex.start()
    await ex.launch(make_launch("gone-1", command))
    shim, child = await started(ex, "gone-1", "sleep")
    run_dir = ex.root / "gone-1"
    moved = tmp_path / "moved"
    if how == "removed":
        shutil.rmtree(run_dir)
    else:  # another folder under the same name is not the one the shim claimed
        os.rename(run_dir, moved)
        run_dir.mkdir()
    try:
        await wait_gone([child])
        await let_go(shim, [ex.root, moved])  # the supervisor is done with the run
    finally:
        kill_leftovers(ex.root)
    assert alive(shim), "the supervisor goes on: it serves the executor's other runs"
    assert run_folders(ex.root) == ([] if how == "removed" else ["gone-1"])
    if how == "replaced":
        assert list(run_dir.iterdir()) == [], "nothing written into a folder it never claimed"
        assert not (moved / "exit.json").exists(), "nor into its own, once moved away"
    await ex.close()


async def test_an_old_supervisor_never_writes_into_a_new_run_folder_of_its_name(
    patient: process.ProcessExecutor, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    await patient.launch(make_launch("again-1", IGNORES_TERM))
    old_shim, old_child = await started(patient, "again-1", "sleep")
    run_dir = patient.root / "again-1"
    shutil.rmtree(run_dir)
    await patient.launch(make_launch("again-1", waiter(go)))  # made anew, not as a relaunch
    new_child = pid_of(run_dir, "child.pid")
    os.kill(old_child, signal.SIGKILL)  # the old command ends while the new folder is there
    await wait_gone([old_child])
    await eventually(
        lambda: f"{run_dir} (deleted)" not in open_paths(old_shim),
        what="the supervisor done with the old run",
    )
    assert not (run_dir / "exit.json").exists(), "the old run's end was written into the new folder"
    go.touch()
    obs = await wait_for(patient, "again-1")
    assert (obs.exit_code, obs.reason) == (3, "exited with code 3")
    assert json.loads((run_dir / "child.pid").read_text())["pid"] == new_child


async def test_a_relaunch_stops_the_earlier_copy_before_it_starts_the_new_one(
    patient: process.ProcessExecutor, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="corral.executors.process")
    go = tmp_path / "go"
    await patient.launch(make_launch("re-1", IGNORES_TERM))
    old_shim, old_child = await started(patient, "re-1", "sleep")
    run_dir = patient.root / "re-1"
    shutil.rmtree(run_dir)
    await patient.launch(relaunch_of(make_launch("re-1", waiter(go))))
    assert not alive(old_child), "the old command still runs beside the new one"
    assert pid_of(run_dir, "shim.pid") == old_shim, "one supervisor serves both copies in turn"
    new_child = pid_of(run_dir, "child.pid")  # /proc shows its environment once it has exec'd
    await eventually(lambda: processes_of(run_dir) == [new_child], what="only the new copy runs")
    assert f"pid {old_child}" in caplog.text
    go.touch()
    obs = await wait_for(patient, "re-1")
    assert (obs.exit_code, obs.reason) == (3, "exited with code 3")


async def test_a_relaunch_stops_a_command_orphaned_by_its_killed_supervisor(
    patient: process.ProcessExecutor, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    await patient.launch(make_launch("orphan-3", IGNORES_TERM))
    old_shim, old_child = await started(patient, "orphan-3", "sleep")
    run_dir = patient.root / "orphan-3"
    os.kill(old_shim, signal.SIGKILL)
    await wait_gone([old_shim])
    shutil.rmtree(run_dir)
    await patient.launch(relaunch_of(make_launch("orphan-3", waiter(go))))
    assert not alive(old_child), "the orphaned command still runs beside the new one"
    new_child = pid_of(run_dir, "child.pid")  # /proc shows its environment once it has exec'd
    await eventually(lambda: processes_of(run_dir) == [new_child], what="only the new copy runs")
    go.touch()
    obs = await wait_for(patient, "orphan-3")
    assert (obs.exit_code, obs.reason) == (3, "exited with code 3")


async def test_a_relaunch_of_a_run_still_there_stops_nothing(
    patient: process.ProcessExecutor,
) -> None:
    launch = make_launch("there-1", ["sleep", "300"])
    await patient.launch(launch)
    shim, child = await started(patient, "there-1", "sleep")
    await patient.launch(relaunch_of(launch))  # its folder says it runs: that is the copy
    assert alive(shim)
    assert alive(child)
    assert processes_of(patient.root / "there-1") == [child]


def lock_waiters(root: Path) -> list[str]:
    """Who waits for the claims lock of `root` now, from /proc/locks: READ for a shim
    about to claim its name, WRITE for a relaunch about to look for earlier copies."""
    inode = os.stat(root).st_ino
    waiting = []
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if fields[1] == "->" and fields[6].rsplit(":", 1)[-1] == str(inode):
            waiting.append(fields[4])
    return waiting


async def test_a_relaunch_never_stops_the_first_launch_that_claims_the_name_meanwhile(
    patient: process.ProcessExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a slow machine recovery may relaunch a name whose first launch is still under way
    (past launch_grace). The relaunch finds no run folder, so it looks in /proc for the
    processes of an earlier copy; if the first launch could claim the name and start
    its command in between, the relaunch would kill the very launch it then finds there.
    Here /proc is read only once the first launch has come as far as it can meanwhile."""
    listing, resume = threading.Event(), threading.Event()
    scandir = os.scandir

    def slow_proc(path: Any = ".") -> Any:
        if str(path) == "/proc" and not resume.is_set():
            listing.set()
            resume.wait(PATIENCE)
        return scandir(path)

    monkeypatch.setattr(os, "scandir", slow_proc)
    launch = make_launch("slow-1", ["sleep", "300"])
    relaunch = asyncio.create_task(patient.launch(relaunch_of(launch)))
    await eventually(listing.is_set, what="the relaunch about to read /proc")
    first = asyncio.create_task(patient.launch(launch))
    await eventually(
        lambda: first.done() or "READ" in lock_waiters(patient.root),
        what="the first launch started, or its shim waiting to claim the name",
    )
    resume.set()
    await asyncio.wait_for(relaunch, PATIENCE)  # found the name launched: nothing to stop
    await asyncio.wait_for(first, PATIENCE)  # claimed once the search let go of the lock
    obs = (await patient.observe(["slow-1"]))["slow-1"]
    assert (obs.phase, obs.reason) == (launching.Phase.RUNNING, None), "its supervisor is alive"
    run_dir = patient.root / "slow-1"
    child = pid_of(run_dir, "child.pid")
    await eventually(lambda: processes_of(run_dir) == [child], what="one copy")


async def test_an_exit_the_supervisor_cannot_record_is_reported_failed_and_retried(
    executor: process.ProcessExecutor,
) -> None:
    """A disk error on the exit record (here: its draft's name taken by a folder) fails
    only that run, as a transient failure pushed to `events`; the supervisor goes on."""
    blocker = sh('mkdir "$CORRAL_RUN_DIR/.exit.json.tmp"; exit 0')
    await executor.launch(make_launch("unrecorded-1", blocker, fence=1))
    events = executor.events()
    obs = await asyncio.wait_for(anext(events), PATIENCE)
    assert (obs.name, obs.phase, obs.reason) == (
        "unrecorded-1",
        launching.Phase.FAILED,
        process.UNRECORDED,
    )
    assert obs.failure_class is model.FailureClass.TRANSIENT
    await executor.launch(make_launch("after-2", ["true"], fence=2))
    assert (await wait_for(executor, "after-2")).phase is launching.Phase.SUCCEEDED
    await events.aclose()


# --- the payload ---------------------------------------------------------------------------------

PAYLOAD = {"greeting": "grüße, 世界, 🐎", "sizes": [1, 2.5], "ok": True, "none": None}


async def test_the_payload_is_a_read_only_file_of_the_run_folder_named_in_the_env(
    executor: process.ProcessExecutor, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    script = (
        f'printf %s "$CORRAL_PAYLOAD_FILE" > {out}.where; stat -c %a "$CORRAL_PAYLOAD_FILE"'
        f' > {out}.mode; cat "$CORRAL_PAYLOAD_FILE" > {out}; echo "[${{CORRAL_PAYLOAD-unset}}]"'
    )
    await executor.launch(make_launch("pay-1", sh(script), payload=PAYLOAD))
    assert (await wait_for(executor, "pay-1")).phase is launching.Phase.SUCCEEDED
    run_dir = executor.root / "pay-1"
    file = run_dir / process_child.PAYLOAD_FILE
    assert Path(f"{out}.where").read_text() == str(file), "the absolute path, in its run folder"
    assert Path(f"{out}.mode").read_text() == "444\n", "read-only, as the command sees it"
    assert file.stat().st_mode & 0o777 == 0o444
    text = out.read_bytes().decode("utf-8")
    assert json.loads(text) == PAYLOAD
    assert "grüße, 世界, 🐎" in text, "UTF-8 as it is, not \\u escapes"
    assert text == launching.payload_json(PAYLOAD), "what every executor delivers"
    assert (run_dir / "stdout.log").read_text() == "[unset]\n", "a file, not a variable"
    assert "grüße" not in (run_dir / "launch.json").read_text(), "written once, not copied"


async def test_a_null_payload_makes_no_file_and_a_spec_cannot_fake_one(
    executor: process.ProcessExecutor,
) -> None:
    fake = {"CORRAL_PAYLOAD_FILE": "/etc/hostname", "CORRAL_PAYLOAD": '"fake"'}
    script = 'echo "${CORRAL_PAYLOAD_FILE-unset} ${CORRAL_PAYLOAD-unset}"'
    await executor.launch(make_launch("nopay-1", sh(script), env=fake))
    await executor.launch(make_launch("pay-2", sh(script), env=fake, payload=[1], fence=2))
    for name in ("nopay-1", "pay-2"):
        assert (await wait_for(executor, name)).phase is launching.Phase.SUCCEEDED
    assert (executor.root / "nopay-1" / "stdout.log").read_text() == "unset unset\n"
    assert not (executor.root / "nopay-1" / process_child.PAYLOAD_FILE).exists()
    payload_file = executor.root / "pay-2" / process_child.PAYLOAD_FILE
    assert (executor.root / "pay-2" / "stdout.log").read_text() == f"{payload_file} unset\n"
    assert payload_file.read_text() == "[1]"


def test_the_payload_file_is_0444_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        folder = process_folder.RunFolder(tmp_path)
        os.close(folder.write("payload.json", '{"a":"é"}'.encode(), mode=0o444))
        os.close(folder.fd)
    finally:
        os.umask(old)
    assert (tmp_path / "payload.json").stat().st_mode & 0o777 == 0o444
    assert (tmp_path / "payload.json").read_bytes() == '{"a":"é"}'.encode()


async def test_a_launch_asked_again_of_a_claimed_name_asks_no_supervisor(
    executor: process.ProcessExecutor,
) -> None:
    """Recovery launches a run it finds again before it adopts it: a new corral's executor
    answers from the run folder, with no supervisor started for it."""
    launch = make_launch("again-1", ["sleep", "300"], payload=PAYLOAD)
    await executor.launch(launch)
    await started(executor, "again-1", "sleep")
    assert len(processes_of(executor.root / "again-1")) == 1, "the command has its environment"
    after_restart = process.ProcessExecutor(root=executor.root, clock=clock.SystemClock())
    await after_restart.start()
    try:
        await after_restart.launch(relaunch_of(launch))
        assert after_restart.supervisor_pid is None
        with pytest.raises(errors.LaunchConflict):
            await after_restart.launch(relaunch_of(make_launch("again-1", ["true"], fence=9)))
    finally:
        await after_restart.close()
    assert len(processes_of(executor.root / "again-1")) == 1, "still the one copy"
    await executor.cancel("again-1", timedelta(seconds=1))


# --- the run log ------------------------------------------------------------------------------


async def test_an_ended_command_brings_its_output_tails_without_a_read_of_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor says the last `log_bytes` of stdout and stderr with a success, so the
    executor hears them without reading the folder; a character cut at the start of a tail
    is dropped, bytes that are not UTF-8 are replaced, and each stream says its size."""
    ex = process.ProcessExecutor(
        root=tmp_path / "runs", clock=clock.SystemClock(), poll_interval=3600, log_bytes=4
    )

    def no_read(run_dir: Path, limit: int) -> dict[str, Any]:
        raise AssertionError(f"read {run_dir} again")

    monkeypatch.setattr(process_runs, "read_tails", no_read)
    await ex.start()
    try:
        async with contextlib.aclosing(ex.events()) as events:
            script = r"printf 'ab éé\n'; printf 'b\377\n' >&2"
            await ex.launch(make_launch("tails-1", sh(script)))
            obs = await asyncio.wait_for(anext(events), PATIENCE)
    finally:
        await ex.close()
        kill_leftovers(ex.root)
    assert obs.phase is launching.Phase.SUCCEEDED
    assert obs.output is not None
    out, err = obs.output.streams
    assert (out.name, out.text, out.size, out.cut) == ("stdout", "é\n", 8, True)
    assert (err.name, err.text, err.size, err.cut) == ("stderr", "b\ufffd\n", 3, False)
    assert obs.output.latency is not None
    assert obs.output.latency >= 0


async def test_a_failure_read_from_its_folder_has_the_same_run_log(
    executor: process.ProcessExecutor,
) -> None:
    await executor.launch(make_launch("tails-2", sh("echo to stdout; echo boom >&2; exit 2")))
    obs = await wait_for(executor, "tails-2")
    assert obs.output is not None
    assert [(s.name, s.text, s.size, s.cut) for s in obs.output.streams] == [
        ("stdout", "to stdout\n", 10, False),
        ("stderr", "boom\n", 5, False),
    ]
    assert obs.message == "boom"


async def test_a_command_that_printed_nothing_has_an_empty_run_log(
    executor: process.ProcessExecutor,
) -> None:
    async with contextlib.aclosing(executor.events()) as events:
        await executor.launch(make_launch("quiet-1", ["true"]))
        obs = await asyncio.wait_for(anext(events), PATIENCE)
    assert obs.output is not None
    assert obs.output.streams == ()


async def test_a_long_output_s_tail_arrives_whole_over_many_reads(
    executor: process.ProcessExecutor,
) -> None:
    """The supervisor's message with a 64 KiB tail is longer than one read of its socket."""
    async with contextlib.aclosing(executor.events()) as events:
        script = "head -c 200000 /dev/zero | tr '\\0' x; echo; echo end"
        await executor.launch(make_launch("long-1", sh(script)))
        obs = await asyncio.wait_for(anext(events), PATIENCE)
    assert obs.output is not None
    [out] = obs.output.streams
    assert (out.size, out.cut, len(out.text)) == (200_005, True, launching.STREAM_BYTES)
    assert out.text.endswith("xxx\nend\n")
