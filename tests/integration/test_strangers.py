"""A tenant's process jobs run as strangers to corral: under their own uid (uid_range), and
in a bubblewrap sandbox too. Each tries what a hostile tenant's job tried on corral's host
(read the settings, the database, the state folder, another job's work and environment,
corral's own environment; write a token row) and is refused every time.

The commands are the system's (/bin/sh, /usr/bin/python3), which any user may run: the
project's virtualenv is not theirs to read."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sqlite3
import tempfile
import textwrap
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from corral import clock, config, errors, launching, model, policy
from corral.executors import base, process, process_sandbox
from tests.support import launches
from tests.support.procs import alive, kill_leftovers
from tests.support.wait import PATIENCE, eventually

pytestmark = [
    pytest.mark.timeout(6 * PATIENCE),
    pytest.mark.skipif(os.geteuid() != 0, reason="starting commands as other users takes root"),
]

PYTHON = "/usr/bin/python3"
UIDS = (180000, 189999)
SECRET = "hunter2-corral-secret"

MODES = {
    "uid_range": {"uids": list(UIDS), "sandbox": None},
    "uid_range+bwrap": {"uids": list(UIDS), "sandbox": "bwrap"},
}


@dataclasses.dataclass
class Host:
    """corral's folder on the host, as a tenant's job would find it."""

    state: Path
    settings: Path
    database: Path
    executor: process.ProcessExecutor


@pytest.fixture(params=sorted(MODES))
async def host(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Host]:
    if MODES[request.param]["sandbox"] and shutil.which("bwrap") is None:
        pytest.fail("bwrap is missing: `make test` installs Debian's bubblewrap")
    # Not under pytest's tmp_path: that is closed to other users (0700), as /root is.
    state = Path(tempfile.mkdtemp(prefix="corral-strangers-", dir="/tmp"))
    settings = state / "corral.toml"
    settings.write_text(f'smtp_password = "{SECRET}"\n')
    settings.chmod(0o600)
    database = state / "corral.db"
    with sqlite3.connect(database) as db:
        db.execute("create table tokens (name text)")
    database.chmod(0o600)
    monkeypatch.setenv("CORRAL_SECRET_OF_CORRAL", SECRET)  # corral's environment
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    strangers = {
        **MODES[request.param],
        "hide": [str(state), str(settings), str(database)],
        "shown": [],
    }
    ex = process.ProcessExecutor(
        root=state / "runs",
        clock=clock.SystemClock(),
        poll_interval=0.05,
        strangers=strangers,
        state_dir=state,
    )
    await ex.start()
    try:
        yield Host(state, settings, database, ex)
    finally:
        await ex.close()
        kill_leftovers(ex.root)
        shutil.rmtree(state, ignore_errors=True)


def stranger(
    name: str, command: list[str], *, spec: dict[str, Any] | None = None, **kw: Any
) -> launching.Launch:
    made = launches.make_launch(
        "process",
        name,
        {"command": command, **(spec or {})},
        tenant="b",
        reach=launching.Reach(api_url="http://corral.test"),
        **kw,
    )
    return dataclasses.replace(made, stranger=True)


async def finished(ex: process.ProcessExecutor, name: str) -> launching.Observation:
    async def done() -> launching.Observation | None:
        obs = (await ex.observe([name]))[name]
        return obs if obs.phase.finished else None

    found: launching.Observation = await eventually(done, what=f"{name} finished")
    return found


async def running_pid(ex: process.ProcessExecutor, name: str, ready: str) -> int:
    """The pid of `name`'s command, once its work folder holds `ready`."""
    run = ex.root / name

    async def there() -> int | None:
        if not (run / "work" / ready).exists():
            return None
        return int(json.loads((run / "child.pid").read_text())["pid"])

    pid: int = await eventually(there, what=f"{name} ready")
    return pid


TRIES = textwrap.dedent(
    """
    import json, os, sqlite3, sys
    state, settings, database, other_work, other_pid, corral_pid = sys.argv[1:7]
    out = {}
    def attempt(what, do):
        try:
            out[what] = ["allowed", repr(do())[:200]]
        except Exception as exc:
            out[what] = ["refused", type(exc).__name__]
    attempt("settings", lambda: open(settings).read())
    attempt("database", lambda: open(database, "rb").read(100))
    attempt("state folder", lambda: os.listdir(state))
    attempt("another job's work", lambda: open(os.path.join(other_work, "mine")).read())
    attempt("another job's run folder", lambda: os.listdir(os.path.dirname(other_work)))
    attempt("another job's environment", lambda: open(f"/proc/{other_pid}/environ").read())
    attempt("corral's environment", lambda: open(f"/proc/{corral_pid}/environ").read())
    def token():
        db = sqlite3.connect(database)
        db.execute("insert into tokens values ('admin of every tenant')")
        db.commit()
    attempt("a token row", token)
    attempt("signal corral", lambda: os.kill(int(corral_pid), 0))
    out["env"] = dict(os.environ)
    out["uid"] = os.getuid()
    out["cwd"] = os.getcwd()
    open("written", "w").write("mine")
    print(json.dumps(out))
    """
)


async def test_a_strangers_job_reaches_nothing_of_corral_nor_of_another_job(host: Host) -> None:
    ex = host.executor
    keeper = ["/bin/sh", "-c", "echo secret-of-a > mine; touch ready; exec sleep 300"]
    await ex.launch(stranger("a-1", keeper, job_id=1, fence=1))
    other_pid = await running_pid(ex, "a-1", "ready")
    other_work = ex.root / "a-1" / "work"
    args = [host.state, host.settings, host.database, other_work, other_pid, os.getpid()]
    await ex.launch(
        stranger("b-1", [PYTHON, "-c", TRIES, *map(str, args)], job_id=2, fence=2, payload=[1])
    )
    obs = await finished(ex, "b-1")
    stdout = (ex.root / "b-1" / "stdout.log").read_text()
    assert obs.phase is launching.Phase.SUCCEEDED, (ex.root / "b-1" / "stderr.log").read_text()
    said = json.loads(stdout)
    tried = {k: v for k, v in said.items() if isinstance(v, list)}
    # A sandbox shows the path down to the job's own run folder, made for its mounts, and
    # nothing else of the state folder; without one the folder cannot be listed.
    if tried["state folder"] == ["allowed", "['runs']"]:
        assert MODES["uid_range+bwrap"]["sandbox"]
        del tried["state folder"]
    assert len(tried) >= 8
    assert all(verdict == "refused" for verdict, _ in tried.values()), tried
    assert SECRET not in stdout
    with sqlite3.connect(host.database) as db:
        assert db.execute("select count(*) from tokens").fetchone() == (0,)
    # Its own environment is an allow-list: nothing of corral's, its HOME its work folder.
    env = said["env"]
    work = str(ex.root / "b-1" / "work")
    assert env["HOME"] == work == said["cwd"]
    assert env["CORRAL_JOB_ID"] == "2"
    assert env["PATH"] == process_sandbox.SAFE_PATH
    assert not {"CORRAL_SECRET_OF_CORRAL", "AWS_SECRET_ACCESS_KEY"} & env.keys()
    assert "CORRAL_DATABASE_URL" not in env
    # Under its own uid, picked from the range; another job's is another.
    assert UIDS[0] <= said["uid"] <= UIDS[1]
    other_uid = os.stat(other_work).st_uid
    assert UIDS[0] <= other_uid <= UIDS[1]
    assert other_uid != said["uid"]
    # It reads its own payload and writes its work folder; the bookkeeping stays corral's.
    assert os.stat(ex.root / "b-1" / "work" / "written").st_uid == said["uid"]
    # While it runs, a run folder is root's and its group's; once it ended, root's alone:
    # a later attempt given the uid reads nothing of it.
    live = os.stat(ex.root / "a-1")
    assert (live.st_uid, live.st_gid, live.st_mode & 0o777) == (0, other_uid, 0o750)
    ended = os.stat(ex.root / "b-1")
    assert (ended.st_uid, ended.st_gid, ended.st_mode & 0o777) == (0, 0, 0o700)
    assert (os.stat(ex.root / "b-1" / "launch.json").st_mode & 0o777) == 0o600
    assert os.stat(ex.root).st_mode & 0o777 == 0o711
    assert os.stat(host.state).st_mode & 0o777 == 0o711


async def test_a_strangers_job_reads_its_payload_and_its_run_folder(host: Host) -> None:
    ex = host.executor
    script = 'cat "$CORRAL_PAYLOAD_FILE"; ls "$CORRAL_RUN_DIR" >/dev/null && echo listed'
    await ex.launch(stranger("p-1", ["/bin/sh", "-c", script], payload={"n": 7}))
    obs = await finished(ex, "p-1")
    assert obs.phase is launching.Phase.SUCCEEDED, (ex.root / "p-1" / "stderr.log").read_text()
    assert (ex.root / "p-1" / "stdout.log").read_text() == '{"n":7}listed\n'


async def test_what_a_stranger_leaves_behind_is_gone_when_it_ends(host: Host) -> None:
    ex = host.executor
    left = f"/tmp/corral-left-{os.getpid()}"
    script = (
        "setsid sleep 300 >/dev/null 2>&1 < /dev/null & echo $! > left;"
        f" mkdir {left} && echo x > {left}/file && touch {left}-file; exit 0"
    )
    await ex.launch(stranger("l-1", ["/bin/sh", "-c", script]))
    obs = await finished(ex, "l-1")
    assert obs.phase is launching.Phase.SUCCEEDED, (ex.root / "l-1" / "stderr.log").read_text()
    uid = os.stat(ex.root / "l-1" / "work").st_uid

    def none_left() -> bool:
        return not process_sandbox.uids_running(uid, uid)

    await eventually(none_left, what=f"every process of uid {uid} gone")
    # Nor what it left in the host's shared /tmp (a sandbox's /tmp is its own anyway).
    assert not os.path.lexists(left)
    assert not os.path.lexists(f"{left}-file")


async def test_a_strangers_variables_reach_its_command_only(host: Host) -> None:
    """setpriv runs as root: a LD_PRELOAD of the tenant's must not reach it (nor bwrap, nor
    env), only the command it runs (as itself), whose loader then says it once."""
    ex = host.executor
    missing = "/nonexistent/corral-preload.so"
    env = {"LD_PRELOAD": missing, "GCONV_PATH": "/nonexistent"}
    await ex.launch(stranger("e-1", ["/bin/sh", "-c", "exit 0"], spec={"env": env}))
    obs = await finished(ex, "e-1")
    assert obs.phase is launching.Phase.SUCCEEDED
    said = (ex.root / "e-1" / "stderr.log").read_text()
    assert said.count(missing) == 1, said


@pytest.mark.parametrize("cwd", ["/", "../..", "sub/../../.."])
async def test_a_strangers_cwd_never_leads_out_of_its_work_folder(host: Host, cwd: str) -> None:
    ex = host.executor
    await ex.launch(stranger("w-1", ["/bin/sh", "-c", "pwd"], spec={"cwd": cwd}))
    obs = await finished(ex, "w-1")
    assert obs.phase is launching.Phase.FAILED
    assert "leads out of the work folder" in (obs.reason or ""), obs


async def test_a_cancelled_stranger_gets_its_grace_and_its_exit_is_its_own(host: Host) -> None:
    ex = host.executor
    script = "trap 'echo stopping; exit 3' TERM; touch ready; while :; do sleep 0.05; done"
    await ex.launch(stranger("c-1", ["/bin/sh", "-c", script]))
    pid = await running_pid(ex, "c-1", "ready")
    await ex.cancel("c-1", grace=timedelta(seconds=PATIENCE))
    obs = await finished(ex, "c-1")
    assert obs.exit_code == 3, obs
    assert (ex.root / "c-1" / "stdout.log").read_text() == "stopping\n"
    assert not alive(pid)


async def test_a_tenants_launch_is_refused_where_strangers_cannot_run(tmp_path: Path) -> None:
    ex = process.ProcessExecutor(root=tmp_path / "runs", clock=clock.SystemClock())
    await ex.start()
    try:
        with pytest.raises(errors.ConfigError, match="uid_range or executors.process.sandbox"):
            await ex.launch(stranger("x-1", ["/bin/true"]))
        assert not (ex.root / "x-1").exists()
    finally:
        await ex.close()


@pytest.fixture
def reachable() -> Iterator[Path]:
    """A folder other users may pass through, as /tmp is (pytest's tmp_path is not)."""
    made = Path(tempfile.mkdtemp(prefix="corral-strangers-", dir="/tmp"))
    made.chmod(0o711)
    yield made
    shutil.rmtree(made, ignore_errors=True)


@pytest.mark.parametrize(
    ("tool", "said"), [("BWRAP", "bwrap is not installed"), ("SETPRIV", "setpriv")]
)
async def test_corral_refuses_to_start_where_strangers_cannot_run(
    reachable: Path, monkeypatch: pytest.MonkeyPatch, tool: str, said: str
) -> None:
    monkeypatch.setattr(process_sandbox, tool, "no-such-tool")
    ex = process.ProcessExecutor(
        root=reachable / "runs",
        clock=clock.SystemClock(),
        strangers={"uids": list(UIDS), "sandbox": "bwrap"},
    )
    with pytest.raises(errors.ConfigError, match=said):
        await ex.start()
    await ex.close()


async def test_a_root_corral_refuses_a_sandbox_without_a_uid_range(tmp_path: Path) -> None:
    ex = process.ProcessExecutor(
        root=tmp_path / "runs", clock=clock.SystemClock(), strangers={"sandbox": "bwrap"}
    )
    with pytest.raises(errors.ConfigError, match="set executors.process.uid_range too"):
        await ex.start()
    await ex.close()


async def test_a_run_folder_others_cannot_reach_is_a_settings_error(tmp_path: Path) -> None:
    # pytest's tmp_path is under /tmp/pytest-of-root (0700): closed to the range's users.
    ex = process.ProcessExecutor(
        root=tmp_path / "runs", clock=clock.SystemClock(), strangers={"uids": list(UIDS)}
    )
    with pytest.raises(errors.ConfigError, match=r"closed to other users.*chmod o\+x"):
        await ex.start()
    await ex.close()


def test_settings_grant_process_only_to_strangers() -> None:
    grant = {"tenants": {"b": {"executors": ["process"]}}}
    with pytest.raises(ValueError, match="must run as strangers"):
        config.Settings(**grant)
    made = config.Settings(**grant, executors={"process": {"uid_range": "100000-165535"}})
    assert made.executors.process.uids == (100000, 165535)
    assert config.Settings(**grant, executors={"process": {"sandbox": "bwrap"}})


@pytest.mark.parametrize(
    ("given", "rule"),
    [
        ("100000", "is not START-END"),
        ("5-10", "1000 <= START"),
        ("200000-100000", "START <= END"),
        ("a-b", "is not START-END"),
    ],
)
def test_a_bad_uid_range_names_the_rule(given: str, rule: str) -> None:
    with pytest.raises(ValueError, match=rule):
        config.Settings(executors={"process": {"uid_range": given}})


def test_a_launch_is_a_strangers_when_its_tenant_is_granted_process_or_made_it() -> None:
    settings = config.Settings(
        tenants={"b": {"executors": ["process", "http"]}},
        executors={"process": {"uid_range": "100000-165535"}},
    )

    def job(tenant: str, executor: str = "process", *, tenant_made: bool = False) -> model.Job:
        now = datetime.now(UTC)
        return model.Job(
            id=1, tenant=tenant, queue="q", pool=None, priority=0, executor=executor,
            spec={}, payload=None, state=model.JobState.RUNNING, run_at=now,
            idempotency_key=None, max_attempts=1, attempt_count=1, labels={},
            created_at=now, updated_at=now, tenant_made=tenant_made,
        )  # fmt: skip

    assert base.stranger_of(settings, job("b")) is True  # whoever submitted it
    assert base.stranger_of(settings, job("default")) is False  # the operator's
    assert base.stranger_of(settings, job("b", "http")) is False
    # A tenant's job whose grant was withdrawn since is a stranger's still: it never runs
    # as corral (the launch is refused where strangers cannot run).
    assert base.stranger_of(settings, job("default", tenant_made=True)) is True
    # A stranger's launch never carries the database's URL, even where the operator's do.
    told = settings.model_copy(update={"jobs_get_database_url": True})
    reaches = base.Reaches(told)
    assert reaches.stranger(job("b")) is True
    assert reaches.stranger(job("default")) is False
    own = policy.JobPolicy()
    assert reaches.of(own, "process", stranger=True).database_url is None
    assert reaches.of(own, "process", stranger=False).database_url is not None
