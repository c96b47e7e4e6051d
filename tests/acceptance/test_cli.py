"""The `corral` command as a user runs it: a real subprocess on a real SQLite file."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import sqlite_copy
from tests.support.cli import Run, corral_env, run_corral
from tests.support.net import free_port, in_thread
from tests.support.wait import PATIENCE


@pytest.fixture
def corral(tmp_path: Path, sqlite_template: Path) -> Run:
    """`corral ARGS` as a user runs it, in tmp_path, on its ./corral.db (migrated: a copy of
    the session's template; `corral db upgrade` has tests of its own)."""

    def run(
        *args: str, env: dict[str, str] | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return run_corral(tmp_path, *args, env=corral_env(env), check=check)

    sqlite_copy(sqlite_template, tmp_path)
    return run


def serve(tmp_path: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "corral", "serve"],
        cwd=tmp_path,
        env=corral_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def job(corral: Run, job_id: str) -> dict[str, object]:
    data: dict[str, object] = json.loads(corral("jobs", "show", job_id, "--json").stdout)
    return data


def wait_for_state(corral: Run, job_id: str, state: str, seconds: float = 60) -> dict[str, object]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = job(corral, job_id)
        if found["state"] == state:
            return found
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} not {state} after {seconds}s: {found}")


def first_attempt_state(corral: Run, job_id: str) -> str | None:
    attempts: list[dict[str, str]] = job(corral, job_id)["attempt_list"]  # type: ignore[assignment]
    return attempts[0]["state"] if attempts else None


def test_upgrade_is_idempotent(corral: Run) -> None:
    assert "up to date" in corral("db", "upgrade").stdout


def test_submit_prints_the_id_and_a_repeated_key_says_so(corral: Run) -> None:
    first = corral("submit", "--idempotency-key", "nightly-1", "--label", "team=data", "--", "true")
    again = corral("submit", "--idempotency-key", "nightly-1", "--", "true")
    assert first.stdout.strip() == again.stdout.strip() == "1"
    assert "already exists" in again.stderr
    as_json = json.loads(
        corral("submit", "--json", "--queue", "etl", "--priority", "5", "--", "true").stdout
    )
    assert as_json == {"id": 2, "created": True}
    listed = json.loads(corral("jobs", "list", "--json").stdout)
    assert [(j["id"], j["queue"], j["priority"], j["state"]) for j in listed] == [
        (2, "etl", 5, "queued"),
        (1, "default", 0, "queued"),
    ]
    assert listed[1]["labels"] == {"team": "data"}
    assert "job 1: due now: waiting for a dispatcher" in corral("jobs", "explain", "1").stdout


def test_submit_from_a_file_checks_every_line_first_and_a_rerun_creates_nothing_twice(
    corral: Run, tmp_path: Path
) -> None:
    lines = [
        {"spec": {"command": ["echo", "a"]}, "idempotency_key": "a", "labels": {"team": "x"}},
        {"spec": {"command": ["echo", "b"]}, "idempotency_key": "b", "queue": "q", "priority": 3},
    ]
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")  # a blank line too
    first = json.loads(corral("submit", "--from-file", str(jobs), "--json").stdout)
    assert (first["created"], first["existing"]) == (2, 0)
    again = corral("submit", "--from-file", str(jobs))
    assert again.stdout.split() == [str(j["id"]) for j in first["jobs"]], "the same jobs"
    assert "2 jobs: 0 new, 2 already there" in again.stderr
    listed = {j["id"]: j for j in json.loads(corral("jobs", "list", "--json").stdout)}
    b = listed[first["jobs"][1]["id"]]
    assert (b["queue"], b["priority"], len(listed)) == ("q", 3, 2)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"spec": {"command": ["echo", "c"]}}\n{"spec": {"command": []}}\n')
    refused = corral("submit", "--from-file", str(bad), check=False)
    assert refused.returncode == 2
    assert "line 2: process spec: command: must be a non-empty list of strings" in refused.stderr
    assert len(json.loads(corral("jobs", "list", "--json").stdout)) == 2, "nothing stored"


def test_submit_from_stdin_names_a_bad_field_and_refuses_options_beside_the_file(
    corral: Run, tmp_path: Path
) -> None:
    proc = run_corral(
        tmp_path, "submit", "--from-file", "-", stdin='{"spec": {"command": ["true"]}, "prio": 1}\n'
    )
    assert proc.returncode == 2
    assert "line 1: prio: unknown field (allowed: spec, executor" in proc.stderr
    jobs = tmp_path / "one.jsonl"
    jobs.write_text('{"spec": {"command": ["true"]}}\n')
    mixed = corral("submit", "--from-file", str(jobs), "--queue", "x", check=False)
    assert mixed.returncode == 2
    assert "give no --queue beside it" in mixed.stderr
    assert json.loads(corral("jobs", "list", "--json").stdout) == []


def test_an_empty_argument_is_an_argument(corral: Run) -> None:
    job_id = corral("submit", "--", "grep", "", "file").stdout.strip()
    assert job(corral, job_id)["spec"] == {"command": ["grep", "", "file"]}


def test_version_and_config_after_the_command(corral: Run, tmp_path: Path) -> None:
    assert corral("--version").stdout.strip().startswith("corral 0.")
    (tmp_path / "other.toml").write_text('database_url = "sqlite:///other.db"\n')
    corral("db", "upgrade", "--config", "other.toml")
    corral("submit", "--config", "other.toml", "--", "true")
    assert [
        j["id"]
        for j in json.loads(corral("--config", "other.toml", "jobs", "list", "--json").stdout)
    ] == [1]
    assert json.loads(corral("jobs", "list", "--json").stdout) == [], "corral.db is another store"


def test_commands_that_only_read_create_no_database(tmp_path: Path) -> None:
    attempt = {"CORRAL_JOB_ID": "1", "CORRAL_FENCE": "1", "CORRAL_ATTEMPT": "1"}
    for args, extra in (
        (["jobs", "list"], {}),
        (["jobs", "show", "1"], {}),
        (["dead", "list"], {}),
        (["submit", "--", "true"], {}),
        (["heartbeat"], attempt),  # which checks no revision, but still the file
    ):
        proc = run_corral(tmp_path, *args, env=corral_env(extra))
        assert proc.returncode == 1, proc.stderr
        assert "there is no database at corral.db" in proc.stderr
        assert "corral db upgrade" in proc.stderr
        assert not (tmp_path / "corral.db").exists()


def test_jobs_list_filters_by_queue_tenant_and_pool(corral: Run) -> None:
    env = {"CORRAL_POOLS": '{"backfill": 2}'}
    corral("submit", "--queue", "etl", "--", "true", env=env)
    corral("submit", "--tenant", "acme", "--", "true", env=env)
    corral("submit", "--pool", "backfill", "--", "true", env=env)

    def ids(*args: str) -> list[int]:
        return [
            j["id"] for j in json.loads(corral("jobs", "list", "--json", *args, env=env).stdout)
        ]

    assert ids() == [3, 2, 1]
    assert ids("--queue", "etl") == [1]
    assert ids("--tenant", "acme") == [2]
    assert ids("--pool", "backfill") == [3]
    assert ids("--queue", "etl", "--tenant", "acme") == []


def test_explain_and_check_print_json(corral: Run) -> None:
    corral("submit", "--", "true")
    explained = json.loads(corral("jobs", "explain", "1", "--json").stdout)
    assert explained["id"] == 1
    assert explained["state"] == "queued"
    assert explained["cause"] == "due now"
    assert explained["explanation"].startswith("due now: waiting for a dispatcher")
    chain = json.loads(corral("check", "--json").stdout)
    assert chain["ok"] is True
    assert chain["broken"] == []
    [link] = [x for x in chain["links"] if x["inner"] == "timeouts.step_deadline"]
    assert (link["outer"], link["inner_value"], link["outer_value"], link["needed"]) == (
        "timeouts.attempt_deadline",
        120.0,
        240.0,
        5.0,
    )
    assert (link["unit"], link["ok"]) == ("seconds", True)
    broken = corral("check", "--json", env={"CORRAL_TIMEOUTS__STEP_DEADLINE": "239"}, check=False)
    assert broken.returncode == 1
    assert json.loads(broken.stdout)["ok"] is False


def test_check_warns_of_what_could_hand_corral_s_secrets_to_others(
    corral: Run, tmp_path: Path
) -> None:
    """A settings file or database other users may read, and jobs given the database's
    URL, are warnings that say what to do; never a failure."""
    settings, database = tmp_path / "corral.toml", tmp_path / "corral.db"
    settings.write_text('api_url = "http://127.0.0.1:9/"\n')
    settings.chmod(0o600)
    database.chmod(0o600)
    assert "warning:" not in corral("check").stderr
    settings.chmod(0o644)
    database.chmod(0o640)
    loud = corral("check")
    assert (
        "warning: the settings file corral.toml is readable by other users (mode 0644): it"
        " holds corral's secrets; chmod 600 corral.toml" in " ".join(loud.stderr.split())
    )
    assert "warning: the database corral.db is readable by other users (mode 0640)" in loud.stderr
    settings.write_text("")  # no api_url: process jobs use the attempt socket, by default
    assert len(json.loads(corral("check", "--json").stdout)["exposed"]) == 2
    settings.write_text("jobs_get_database_url = true\n")  # as corral did before
    said = json.loads(corral("check", "--json").stdout)["exposed"]
    assert len(said) == 3
    assert said[2].startswith("process jobs get CORRAL_DATABASE_URL")


def test_jobs_show_cuts_no_id_state_or_name_in_a_narrow_terminal(
    corral: Run, tmp_path: Path
) -> None:
    queue = "a-rather-long-queue-name"
    corral("submit", "--queue", queue, "--max-attempts", "1", "--", "sh", "-c", "exit 3")
    server = serve(tmp_path)
    try:
        wait_for_state(corral, "1", "failed")
    finally:
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=PATIENCE)
    for columns in ("80", "60"):
        shown = corral("jobs", "show", "1", env={"COLUMNS": columns}).stdout
        assert "…" not in shown, shown
        for word in ("corral-1-1", queue, "failed", "fence 1"):
            assert word in shown, shown
        assert max(len(line) for line in shown.splitlines()) <= int(columns)
        listed = corral("jobs", "list", env={"COLUMNS": columns}).stdout
        assert "…" not in listed, listed


@pytest.mark.parametrize(
    ("args", "env", "code", "message"),
    [
        (["submit", "--"], {}, 2, "nothing to run: give the command after --"),
        (["submit", "--", ""], {}, 2, "its first item, the program to run, is empty"),
        (
            ["submit", "--at", "2020-01-01T00:00:00Z", "--", "true"],
            {},
            2,
            "--at: 2020-01-01T00:00:00+00:00 is before now; give --allow-past",
        ),
        (["submit", "--executor", "k8s", "--", "true"], {}, 2, "executor: unknown executor 'k8s'"),
        (
            ["submit", "--executor", "kubernetes", "--image", "busybox:1.36", "--", "true"],
            {},
            2,
            "executor: 'kubernetes' is not enabled in this corral (it runs: http, process); add it"
            ' to executors.enabled in corral.toml (enabled = ["http", "process", "kubernetes"])',
        ),
        (["submit", "--policy", "[]", "--", "true"], {}, 2, "--policy: must be a JSON object"),
        (["submit", "--policy", "null", "--", "true"], {}, 2, "--policy: must be a JSON object"),
        (["submit", "--policy", "0", "--", "true"], {}, 2, "--policy: must be a JSON object"),
        (["submit", "-o", "json", "--", "true"], {}, 2, "-o/--output is the format of --dry-run"),
        (
            [
                *("submit", "--deadline", "5s", "--policy"),
                *('{"limits": {"attempt_deadline": "10s"}}', "--", "true"),
            ],
            {},
            2,
            "--deadline 5s and --policy limits.attempt_deadline 10s disagree",
        ),
        (
            ["submit", "--heartbeat", "--policy", '{"heartbeat": false}', "--", "true"],
            {},
            2,
            "--heartbeat and --policy heartbeat false disagree",
        ),
        (
            [
                *("submit", "--executor", "kubernetes", "--image", "Bad Image!!"),
                *("--dry-run", "--", "true"),
            ],
            {},
            2,
            "kubernetes spec: image: 'Bad Image!!' is not an image reference",
        ),
        (
            [
                *("submit", "--executor", "kubernetes", "--dry-run", "--spec"),
                '{"image": "busybox:1.36", "command": ["true"], "service_account": "corral"}',
            ],
            {},
            2,
            "service_account: 'corral' is not allowed: a job may only run as one of"
            " executors.kubernetes.allowed_service_accounts",
        ),
        (["check"], {"CORRAL_EXECUTORS__ENABLED": '["nomad"]'}, 2, "unknown executor 'nomad'"),
        (["jobs", "list"], {"CORRAL_DATABSE_URL": "x"}, 2, "did you mean CORRAL_DATABASE_URL?"),
        (["jobs", "list"], {"CORRAL_DATABASE_URL": "sqlite:///"}, 2, "in-memory SQLite"),
        (["jobs", "list"], {"CORRAL_DATABASE_URL": "sqlite:///:memory:"}, 2, "in-memory SQLite"),
        (["jobs", "list", "--config", "nothere.toml"], {}, 2, "'nothere.toml' does not exist"),
        (["submit", "--label", "team", "--", "true"], {}, 2, "--label 'team': use KEY=VALUE"),
        (["submit", "--label", "te am=x", "--", "true"], {}, 2, "label key 'te am'"),
        (["submit", "--payload", "{not json", "--", "true"], {}, 2, "--payload: not valid JSON"),
        (["submit", "--priority", "5000", "--", "true"], {}, 2, "priority: 5000 must be between"),
        (["submit", "--queue", "bad queue", "--", "true"], {}, 2, "queue: 'bad queue' must be"),
        (["submit", "--max-attempts", "0", "--", "true"], {}, 2, "max_attempts: 0 must be between"),
        (["submit", "--", "true"], {"CORRAL_MAX_PAYLOAD_BYTES": "x"}, 2, "max_payload_bytes"),
        (
            ["jobs", "list"],
            {"CORRAL_DATABASE_URL": "mysql://h/db"},
            2,
            "database_url: 'mysql://h/db' is not a supported",
        ),
        (
            ["jobs", "list"],
            {
                "CORRAL_DATABASE_URL": "postgresql+psycopg://u@127.0.0.1:1/db",
                "CORRAL_TIMEOUTS__LAUNCH_GRACE": "5s",  # room for a store call on PostgreSQL
            },
            1,
            "Connection refused",
        ),
        (
            ["jobs", "list"],
            {"CORRAL_EXECUTORS__ENABLED": '["process","warp"]'},
            2,
            "unknown executor 'warp'",
        ),
        (["jobs", "show", "42"], {}, 1, "no job with id 42"),
        (["jobs", "list", "--state", "done"], {}, 2, "state: 'done' is not a job state"),
        (["jobs", "cancel", "42"], {}, 1, "no job with id 42"),
        (["nope"], {}, 2, "No such command"),
        (["submit", "--spec", "5"], {}, 2, "process spec: spec: must be a JSON object"),
        (
            ["submit", "--spec", '{"command": ["echo", "a\\u0000"]}'],
            {},
            2,
            "spec.command.1: must not hold a NUL character",
        ),
        (["jobs", "show", "99999999999999999999"], {}, 2, "not in the range"),
        (
            ["jobs", "list"],
            {"CORRAL_TIMEOUTS__CANCEL_GRACE": "99999999999999999999"},
            2,
            "timeouts.cancel_grace",
        ),
        (
            ["jobs", "list"],
            {"CORRAL_TIMEOUTS__DISPATCH_INTERVAL": "0.0000001"},
            2,
            "between 1ms and 365 days",
        ),
        (
            ["submit", "--deadline", "10m", "--", "true"],
            {},
            2,
            "policy.limits.attempt_deadline: 600s is longer than timeouts.attempt_deadline",
        ),
        (["submit", "--deadline", "soon", "--", "true"], {}, 2, "--deadline: 'soon' is not"),
        (
            ["submit", "--policy", '{"failure_rules": [{"action": "fail"}]}', "--", "true"],
            {},
            2,
            "policy.failure_rules.0: a rule matches on_exit_codes, on_http_statuses or"
            " on_failure_classes: give one",
        ),
        (["submit", "--policy", "[1]", "--", "true"], {}, 2, "--policy: must be a JSON object"),
        (["heartbeat"], {}, 2, "CORRAL_JOB_ID is not set: this is not running as a corral"),
        (["dead", "retry", "42"], {}, 1, "no job with id 42"),
    ],
)
def test_bad_input_is_one_line_with_an_exit_code_and_writes_nothing(
    corral: Run, args: list[str], env: dict[str, str], code: int, message: str
) -> None:
    proc = corral(*args, env=env, check=False)
    assert proc.returncode == code, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert json.loads(corral("jobs", "list", "--json").stdout) == []


def test_oversized_payload_is_refused(corral: Run, tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_text(json.dumps("x" * 2000))
    proc = corral(
        "submit",
        "--payload-file",
        str(big),
        "--",
        "true",
        env={"CORRAL_MAX_PAYLOAD_BYTES": "1000"},
        check=False,
    )
    assert proc.returncode == 2
    assert "payload: 2002 bytes is over the limit of 1000" in proc.stderr
    assert json.loads(corral("jobs", "list", "--json").stdout) == []


def test_a_payload_file_that_is_not_text_is_refused(corral: Run, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"\xff\xfe\x00")
    proc = corral("submit", "--payload-file", str(bad), "--", "true", check=False)
    assert (proc.returncode, "Traceback" in proc.stderr) == (2, False)
    assert "--payload-file: not UTF-8 text" in proc.stderr


def test_serve_before_upgrade_says_what_to_do(tmp_path: Path) -> None:
    proc = run_corral(tmp_path, "serve")
    assert proc.returncode == 1
    assert "run `corral db upgrade`" in proc.stderr


def test_serve_runs_jobs_and_stops_cleanly_on_sigterm(corral: Run, tmp_path: Path) -> None:
    ok = corral("submit", "--", "sh", "-c", "echo out $CORRAL_JOB_ID; echo err >&2").stdout.strip()
    retry_7 = '{"failure_rules": [{"on_exit_codes": {"operator": "In", "values": [7]}, "action": "retry"}]}'
    bad = corral(
        "submit", "--max-attempts", "2", "--policy", retry_7, "--", "sh", "-c", "exit 7"
    ).stdout.strip()
    server = serve(tmp_path)
    try:
        done = wait_for_state(corral, ok, "succeeded")
        failed = wait_for_state(corral, bad, "failed")
    finally:
        server.send_signal(signal.SIGTERM)
        _, stderr = server.communicate(timeout=60)
    assert server.returncode == 0, stderr
    assert "dispatcher stopped" in stderr
    [attempt] = done["attempt_list"]  # type: ignore[misc]
    run_dir = tmp_path / ".corral" / "runs" / attempt["launch_name"]
    assert (run_dir / "stdout.log").read_text() == f"out {ok}\n"
    assert [a["exit_code"] for a in failed["attempt_list"]] == [7, 7]  # type: ignore[union-attr]
    assert [e["to"] for e in failed["events"]][-1] == "failed"  # type: ignore[index]
    too_late = corral("jobs", "cancel", ok, check=False)
    assert too_late.returncode == 2
    assert f"job {ok} has already ended (succeeded)" in too_late.stderr
    logs = corral("jobs", "logs", ok).stdout.splitlines()
    assert logs[0].startswith(f"==> attempt 1 (fence {attempt['fence']}): succeeded, exit 0, ")
    assert logs[1:] == ["--- stdout ---", f"out {ok}", "--- stderr ---", "err"]
    shown = corral("jobs", "show", ok).stdout
    assert "  stdout:\n    out" in shown
    assert f"all of it: corral jobs logs {ok} --attempt 1" in shown
    second = json.loads(corral("jobs", "logs", bad, "--attempt", "2", "--json").stdout)
    assert second == [
        {
            "attempt": 2,
            "fence": failed["attempt_list"][1]["fence"],
            "state": "failed",
            "stream": None,
            "text": "",
        }  # type: ignore[index]
    ]
    missing = corral("jobs", "logs", bad, "--attempt", "3", check=False)
    assert missing.returncode != 0
    assert f"job {bad} has no attempt 3: it has had 2" in missing.stderr


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "ndjson"])
def test_jobs_logs_follow_prints_a_running_job_s_output_as_it_comes(
    corral: Run, tmp_path: Path, as_json: bool
) -> None:
    """Text, or with --json one JSON object a line as each piece comes (NDJSON)."""
    gate = tmp_path / "go"
    script = f"echo before; while [ ! -e {gate} ]; do sleep 0.05; done; echo after; echo oops >&2"
    job_id = corral("submit", "--", "sh", "-c", script).stdout.strip()
    server = serve(tmp_path)
    follow = subprocess.Popen(
        [sys.executable, "-m", "corral", "jobs", "logs", job_id, "--follow"]
        + (["--json"] if as_json else []),
        cwd=tmp_path,
        env=corral_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert follow.stdout is not None
        seen = b""
        deadline = time.monotonic() + PATIENCE
        marker = b'"before\\n"' if as_json else b"before\n"
        while marker not in seen:  # printed while the job waits for the gate
            left = deadline - time.monotonic()
            assert left > 0, f"no output while running: {seen!r}"
            if select.select([follow.stdout], [], [], left)[0]:
                seen += os.read(follow.stdout.fileno(), 4096)
        assert job(corral, job_id)["state"] == "running"
        gate.touch()
        rest, err = follow.communicate(timeout=PATIENCE)  # it ends when the job has
    finally:
        follow.kill()
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=60)
    lines = (seen + rest).decode().splitlines()
    assert follow.returncode == 0, err
    if as_json:
        parts = [json.loads(line) for line in lines]
        assert {(p["attempt"], p["fence"]) for p in parts} == {(1, 1)}
        said = {"stdout": "", "stderr": ""}
        for p in parts:
            said[p["stream"]] += p["text"]
        assert said == {"stdout": "before\nafter\n", "stderr": "oops\n"}
        return
    assert lines[0].startswith("==> attempt 1 (fence 1): ")
    assert lines[1:] == ["--- stdout ---", "before", "after", "--- stderr ---", "oops"]


def test_a_job_started_before_a_crash_completes_after_the_restart(
    corral: Run, tmp_path: Path
) -> None:
    gate = tmp_path / "go"  # the job runs until the test opens it: past the crash
    script = f"while [ ! -e {gate} ]; do sleep 0.05; done; echo survived"
    job_id = corral("submit", "--", "sh", "-c", script).stdout.strip()
    first = serve(tmp_path)
    try:
        deadline = time.monotonic() + 60
        while first_attempt_state(corral, job_id) != "running":  # launched and recorded
            assert time.monotonic() < deadline, "never running"
            time.sleep(0.2)
    finally:
        first.kill()  # SIGKILL: no clean-up of any kind
        first.communicate(timeout=60)
    assert job(corral, job_id)["state"] == "running"
    second = serve(tmp_path)
    gate.touch()
    try:
        done = wait_for_state(corral, job_id, "succeeded")
    finally:
        second.send_signal(signal.SIGTERM)
        second.communicate(timeout=60)
    [attempt] = done["attempt_list"]  # type: ignore[misc]
    assert attempt["attempt"] == 1  # the same attempt, observed after the restart, not a relaunch
    assert (
        tmp_path / ".corral" / "runs" / attempt["launch_name"] / "stdout.log"
    ).read_text() == "survived\n"


def test_cancel_stops_a_running_job(corral: Run, tmp_path: Path) -> None:
    job_id = corral("submit", "--", "sleep", "60").stdout.strip()
    server = serve(tmp_path)
    try:
        wait_for_state(corral, job_id, "running")
        deadline = time.monotonic() + 60
        while first_attempt_state(corral, job_id) != "running":  # launched and recorded
            assert time.monotonic() < deadline, "never running"
            time.sleep(0.2)
        assert "cancelled; stopped attempt" in corral("jobs", "cancel", job_id).stdout
        found = job(corral, job_id)
    finally:
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=60)
    assert found["state"] == "cancelled"
    assert [a["state"] for a in found["attempt_list"]] == ["cancelled"]  # type: ignore[union-attr]
    assert corral("jobs", "cancel", job_id).returncode == 0  # cancelling again is a no-op


def test_check_shows_the_chain_and_fails_on_a_broken_link(tmp_path: Path) -> None:
    def check(**env: str) -> subprocess.CompletedProcess[str]:
        return run_corral(tmp_path, "check", env=corral_env(env))

    ok = check()
    assert ok.returncode == 0, ok.stderr
    assert "all 12 limits nest" in ok.stdout
    for limit in ("http_request_timeout", "step_deadline", "heartbeat_interval", "tick_deadline"):
        assert limit in ok.stdout
    broken = check(CORRAL_TIMEOUTS__ATTEMPT_DEADLINE="6m")
    assert broken.returncode == 1
    assert "BROKEN" in broken.stdout
    assert "timeouts.attempt_deadline (360s) + timeouts.cancel_grace (10s) must be" in broken.stderr
    refused = run_corral(
        tmp_path, "serve", env=corral_env({"CORRAL_TIMEOUTS__ATTEMPT_DEADLINE": "6m"})
    )
    assert refused.returncode == 2, "corral refuses to start on limits that do not nest"
    assert "timeouts.recovery_grace (360s)" in refused.stderr


def test_check_shows_the_database_links_on_postgresql(tmp_path: Path) -> None:
    def check(**env: str) -> subprocess.CompletedProcess[str]:
        return run_corral(tmp_path, "check", env=corral_env({"COLUMNS": "200", **env}))

    on_sqlite = check(CORRAL_TIMEOUTS__LAUNCH_GRACE="30s")
    assert on_sqlite.returncode == 0, on_sqlite.stderr
    assert "n/a: 7 links for PostgreSQL, unused on SQLite" in on_sqlite.stdout
    assert "1 for pods, with no kubernetes or argo executor" in on_sqlite.stdout
    assert on_sqlite.stdout.count("n/a") == 9
    pg = "postgresql+psycopg://corral@127.0.0.1:5432/corral"  # check reads, never connects
    ok = check(CORRAL_DATABASE_URL=pg, CORRAL_TIMEOUTS__LAUNCH_GRACE="30s")
    assert ok.returncode == 0, ok.stderr
    assert "all 19 limits nest" in ok.stdout
    lines = [line.strip() for line in ok.stdout.splitlines()]
    for link in (
        ["database_lock_timeout", "< database_statement_timeout"],
        ["database_transaction_timeout", "+ tick_deadline", "< launch_grace"],
        ["database_transaction_timeout", "<= lease_timeout"],
    ):
        starts = [i for i, line in enumerate(lines) if line.startswith(link[0] + " ")]
        assert any(
            all(lines[i + k].startswith(name) for k, name in enumerate(link[1:], 1)) for i in starts
        ), (link, ok.stdout)
    # corral_env's 2s launch_grace leaves no room for a 5s connect inside a store call.
    broken = check(CORRAL_DATABASE_URL=pg)
    assert broken.returncode == 1
    assert "BROKEN" in broken.stdout
    assert "timeouts.database_connect_timeout (5s) must be at least 0.05s" in broken.stderr


def test_dead_lists_retries_and_discards_quarantined_jobs(corral: Run, tmp_path: Path) -> None:
    fail_4 = '{"failure_rules": [{"on_exit_codes": {"operator": "In", "values": [4]}, "action": "fail"}]}'
    keep = corral("submit", "--policy", fail_4, "--", "sh", "-c", "exit 4").stdout.strip()
    drop = corral("submit", "--policy", fail_4, "--", "sh", "-c", "exit 4").stdout.strip()
    proc = serve(tmp_path)
    try:
        for job_id in (keep, drop):
            wait_for_state(corral, job_id, "quarantined")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    listed = json.loads(corral("dead", "list", "--json").stdout)
    assert sorted(str(j["id"]) for j in listed) == sorted([keep, drop])
    assert listed[0]["attempt_list"][0]["failure_class"] == "permanent"
    table = corral("dead", "list")
    assert "permanent" in table.stdout
    assert "2 quarantined jobs" in table.stderr
    explained = corral("jobs", "explain", keep).stdout
    assert "quarantined: waits for a person" in explained
    assert f"corral dead retry {keep}" in explained
    assert corral("dead", "retry", keep).stdout.strip() == f"job {keep} queued again"
    assert corral("dead", "discard", drop).stdout.strip() == f"job {drop} discarded"
    assert job(corral, keep)["state"] == "queued"
    assert job(corral, drop)["state"] == "cancelled"
    again = corral("dead", "discard", drop, check=False)
    assert again.returncode == 2
    assert "is cancelled, not quarantined" in again.stderr


DRY_RUNS: dict[str, tuple[str, Callable[[Any], Any], Callable[[Any], Any]]] = {
    # kind: (the object, its container, its retry limit: 0, for corral owns retries)
    "kubernetes": (
        "Job",
        lambda doc: doc["spec"]["template"]["spec"]["containers"][0],
        lambda doc: doc["spec"]["backoffLimit"],
    ),
    "argo": (
        "Workflow",
        lambda doc: doc["spec"]["templates"][0]["container"],
        lambda doc: doc["spec"]["templates"][0]["retryStrategy"]["limit"],
    ),
}


@pytest.mark.parametrize("executor", sorted(DRY_RUNS))
def test_submit_dry_run_prints_the_platform_object_and_stores_nothing(
    corral: Run, executor: str
) -> None:
    import yaml

    kind, container, retries = DRY_RUNS[executor]
    args = ["submit", "--executor", executor, "--image", "busybox:1.36", "--dry-run"]
    proc = corral(*args, "--deadline", "2m", "--queue", "etl", "--", "sh", "-c", "echo hi")
    doc = yaml.safe_load(proc.stdout)
    assert (doc["kind"], doc["metadata"]["name"]) == (kind, "corral-0-1")
    assert doc["spec"]["activeDeadlineSeconds"] == 120
    assert container(doc)["command"] == ["sh", "-c", "echo hi"]
    assert container(doc)["image"] == "busybox:1.36"
    assert "nothing stored or created" in proc.stderr
    long_arg = "echo " + "x" * 150
    piped = yaml.safe_load(corral(*args, "--", "sh", "-c", long_arg).stdout)
    assert container(piped)["command"][2] == long_arg
    as_json = json.loads(corral(*args, "-o", "json", "--", "true").stdout)
    assert retries(as_json) == 0
    versioned = yaml.safe_load(corral(*args, "--code-version", "git-abc1", "--", "true").stdout)
    env = {e["name"]: e.get("value") for e in container(versioned)["env"]}
    assert env["CORRAL_CODE_VERSION"] == "git-abc1"
    spaced = corral(*args, "--code-version", "a b", "--", "true", check=False)
    assert spaced.returncode == 2
    assert "code_version: 'a b' must be 1-200 printable characters, no spaces" in spaced.stderr
    refused = corral(*args, "--placement", "gpu", "--", "true", check=False)
    assert refused.returncode == 2
    assert f"{executor} spec: placement: unknown placement class 'gpu'" in refused.stderr
    assert json.loads(corral("jobs", "list", "--json").stdout) == []


def test_submit_dry_run_and_image_are_for_the_container_executors(corral: Run) -> None:
    process = corral("submit", "--dry-run", "--", "true", check=False)
    assert process.returncode == 2
    assert "--dry-run: prints the platform object of --executor argo or kubernetes" in (
        process.stderr
    )
    image = corral("submit", "--image", "busybox", "--", "true", check=False)
    assert image.returncode == 2
    assert "--image and --placement are for --executor argo or kubernetes" in image.stderr


def test_lint_reports_findings_with_exit_1_and_json(corral: Run, tmp_path: Path) -> None:
    manifest = tmp_path / "worker.yaml"
    manifest.write_text(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: corral\n  labels:\n"
        "    corral.dev/component: dispatcher\nspec:\n  template:\n    spec:\n"
        "      containers: []\n"
    )
    proc = corral("lint", str(manifest), check=False)
    assert proc.returncode == 1
    assert f"{manifest}:9: grace-period: Deployment corral:" in proc.stdout
    assert "1 finding" in proc.stderr
    [finding] = json.loads(corral("lint", "--json", str(manifest), check=False).stdout)
    assert (finding["rule"], finding["line"]) == ("grace-period", 9)
    manifest.write_text(
        manifest.read_text().replace(
            "containers: []", "terminationGracePeriodSeconds: 60\n      containers: []"
        )
    )
    assert corral("lint", str(tmp_path)).returncode == 0
    assert corral("lint", str(tmp_path / "nope.yaml"), check=False).returncode == 2


def test_alerts_test_mute_unmute_and_history(corral: Run, tmp_path: Path) -> None:
    """`corral alerts test` sends through a real channel and says so; an unknown channel
    is refused naming it; `mute` is kept in the store and `list` shows it until
    `unmute`; `history --json` has the test message with its try."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    received: list[dict[str, Any]] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    (tmp_path / "corral.toml").write_text(
        f"""
[executors.http]
allow_networks = ["127.0.0.0/8:1024-65535"]

[alerts.channels.hook]
kind = "webhook"
url = "http://127.0.0.1:{server.server_address[1]}/hook"

[alerts.rules.poison]
on = ["quarantined"]
channels = ["hook"]
"""
    )
    with in_thread(server):
        assert "delivered through hook" in corral("alerts", "test", "hook").stdout
        assert [m["type"] for m in received] == ["corral.alert.test"]
        unknown = corral("alerts", "test", "pager", check=False)
        assert unknown.returncode == 2
        assert "no channel 'pager'; defined: hook" in unknown.stderr
        assert (
            "corral alerts unmute poison"
            in corral("alerts", "mute", "poison", "--for", "2h").stdout
        )
        listed = json.loads(corral("alerts", "list", "--json").stdout)
        assert listed["rules"]["poison"]["muted_until"] is not None
        assert "sends again" in corral("alerts", "unmute", "poison").stdout
        listed = json.loads(corral("alerts", "list", "--json").stdout)
        assert listed["rules"]["poison"]["muted_until"] is None
        [sent] = json.loads(corral("alerts", "history", "--json").stdout)
        assert (sent["kind"], sent["state"], len(sent["tries"])) == ("test", "delivered", 1)
        bad = corral("alerts", "mute", "poison", "--for", "soon", check=False)
        assert bad.returncode == 2
        assert "--for" in bad.stderr


def serve_http(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None, api_url: bool = False
) -> tuple[subprocess.Popen[str], str]:
    """`corral serve [ARGS] --http` on a free port of 127.0.0.1, once it answers /readyz:
    the process and its base URL (`api_url`: jobs are told it, as CORRAL_API_URL)."""
    import httpx

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral", "serve", *args, "--http", f"127.0.0.1:{port}"],
        cwd=tmp_path,
        env=corral_env({**(env or {}), **({"CORRAL_API_URL": base} if api_url else {})}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + PATIENCE
    while True:
        try:
            if httpx.get(f"{base}/readyz", timeout=5).status_code == 200:
                return proc, base
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            stopped(proc)
            pytest.fail("the API never answered /readyz")
        time.sleep(0.2)


def stopped(proc: subprocess.Popen[str]) -> str:
    """Stop a `serve_http` process with SIGTERM; what it printed (it must exit 0)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    printed, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return printed


def test_serve_http_answers_a_token_made_by_tokens_create_and_runs_what_it_takes(
    corral: Run, tmp_path: Path
) -> None:
    """`corral tokens create` prints the token alone on its last line; `corral serve
    --http` serves the API with the loops: a command submitted through it is refused (the
    tenant is not granted process), the operator's runs and the API streams it to its end;
    `tokens revoke` ends the token."""
    import httpx

    made = corral("tokens", "create", "--tenant", "default", "--role", "operator").stdout
    token = made.strip().splitlines()[-1]
    assert token.startswith("corral_")
    listed = json.loads(corral("tokens", "list", "--json").stdout)
    assert [(t["tenant"], t["role"], t["revoked_at"]) for t in listed] == [
        ("default", "operator", None)
    ]
    assert token not in corral("tokens", "list").stdout
    server, base = serve_http(tmp_path)
    auth = {"Authorization": f"Bearer {token}"}
    try:
        body = {"spec": {"command": ["sh", "-c", "echo hi from the API"]}, "queue": "api"}
        refused = httpx.post(f"{base}/api/v1/jobs", json=body, headers=auth, timeout=30)
        assert refused.status_code == 403, refused.text  # a tenant is not granted process
        assert "[tenants.default] executors" in refused.json()["error"]
        made = corral(
            "submit", "--queue", "api", "--json", "--", "sh", "-c", "echo hi from the API"
        )
        job_id = json.loads(made.stdout)["id"]  # the operator's: run by the serve
        stream = f"{base}/api/v1/jobs/{job_id}/events/stream"
        seen = []
        with httpx.stream("GET", stream, headers=auth, timeout=PATIENCE) as live:
            for line in live.iter_lines():  # as the job runs; it ends when the job has
                if line.startswith("data:"):
                    seen.append(json.loads(line[5:]))
        assert [e["to"] for e in seen if e["entity"] == "job"][-1] == "succeeded"
        logs = httpx.get(f"{base}/api/v1/jobs/{job_id}/logs", headers=auth, timeout=30).json()
        assert logs[0]["streams"][0]["text"] == "hi from the API\n"
        assert httpx.get(f"{base}/api/v1/jobs", timeout=30).status_code == 401
        corral("tokens", "revoke", str(listed[0]["id"]))
        deadline = time.monotonic() + PATIENCE  # another process: refused within seconds
        while httpx.get(f"{base}/api/v1/jobs", headers=auth, timeout=30).status_code != 401:
            assert time.monotonic() < deadline, "a revoked token is still taken"
            time.sleep(0.5)
    finally:
        stopped(server)


def test_a_job_reaches_corral_through_the_api_with_its_attempt_token_alone(
    corral: Run, tmp_path: Path
) -> None:
    """With api_url set, a process job gets CORRAL_API_URL and CORRAL_ATTEMPT_TOKEN and no
    database URL; `corral heartbeat` and the checkpoint functions work through the API."""
    import httpx

    token = corral("tokens", "create", "--tenant", "default", "--role", "operator")
    auth = {"Authorization": f"Bearer {token.stdout.strip().splitlines()[-1]}"}
    server, base = serve_http(tmp_path, api_url=True)
    py = sys.executable
    inside = tmp_path / "inside.py"
    inside.write_text(
        "import os\n"
        "from corral.sinks import MinRows, Publisher, load_checkpoint, save_checkpoint\n"
        "from corral.worker import keep_alive\n"
        "with keep_alive(interval=0.2) as stale:\n"
        "    save_checkpoint({'page': 2})\n"
        "    print('resumes at', load_checkpoint()['page'])\n"
        "    pub = Publisher('sales/day', root=os.getcwd() + '/out')\n"
        "    pub.stage()\n"
        "    pub.write_rows('part.jsonl', [{'n': 1}])\n"
        "    print('published fence', pub.publish(audits=[MinRows(1)]).fence)\n"
        "    assert not stale.is_set()\n"
    )
    script = (
        'test -z "$CORRAL_DATABASE_URL" || { echo has the database URL; exit 7; }; '
        'test -n "$CORRAL_ATTEMPT_TOKEN" || exit 8; '
        f"{py} -m corral heartbeat && {py} {inside}"
    )
    try:
        made = corral("submit", "--heartbeat", "--json", "--", "sh", "-c", script)
        job = f"{base}/api/v1/jobs/{json.loads(made.stdout)['id']}"
        deadline = time.monotonic() + 2 * PATIENCE
        while (state := httpx.get(job, headers=auth, timeout=30).json()["state"]) != "succeeded":
            assert state in ("queued", "running"), httpx.get(f"{job}/logs", headers=auth).text
            assert time.monotonic() < deadline, f"the job is still {state}"
            time.sleep(0.2)
        [log] = httpx.get(f"{job}/logs", headers=auth, timeout=30).json()
        out = log["streams"][0]["text"]
        assert "lease renewed until" in out
        assert "resumes at 2" in out
        assert f"published fence {log['fence']}" in out
    finally:
        stopped(server)


def test_tokens_and_the_api_refuse_bad_input_naming_the_option(corral: Run) -> None:
    neither = corral("tokens", "create", "--role", "viewer", check=False)
    assert neither.returncode == 2
    assert "--tenant T, or --all-tenants" in neither.stderr
    role = corral("tokens", "create", "--tenant", "a", "--role", "boss", check=False)
    assert role.returncode == 2
    assert "--role" in role.stderr
    where = corral("api", "--http", "localhost", check=False)
    assert where.returncode == 2
    assert "--http" in where.stderr
    assert "HOST:PORT" in where.stderr
    gone = corral("tokens", "revoke", "99", check=False)
    assert gone.returncode != 0
    assert "no token 99" in gone.stderr


def test_serve_http_prints_a_first_admin_token_once_and_where_things_are(
    corral: Run, tmp_path: Path
) -> None:
    """What `make run` runs: on a store without an all-tenant admin token, one is made and
    shown once, on standard error as a plain line, with the API's and the dashboard's URLs;
    the next start makes none."""
    import httpx

    first, base = serve_http(tmp_path, "--demo")
    first.send_signal(signal.SIGTERM)
    _, said = first.communicate(timeout=60)
    lines = said.splitlines()
    at = next(i for i, line in enumerate(lines) if "a first admin token" in line)
    token = lines[at + 1]
    assert token.startswith("corral_")
    assert f"corral: the API: {base}/api/v1" in said
    assert f"corral: the dashboard: {base}/ui/" in said
    again, base = serve_http(tmp_path, "--demo")
    listed = httpx.get(
        f"{base}/api/v1/jobs?queue=demo", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )
    again.send_signal(signal.SIGTERM)
    _, said_again = again.communicate(timeout=60)
    assert "corral_" not in said_again  # no second token
    assert f"corral: the dashboard: {base}/ui/" in said_again
    assert listed.status_code == 200
    assert len(listed.json()["jobs"]) == 5


@pytest.mark.parametrize("command", ["serve", "api"])
def test_a_busy_port_is_refused_before_anything_is_served(
    corral: Run, tmp_path: Path, command: str
) -> None:
    import socket as sockets

    with sockets.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        said = corral(command, "--http", f"127.0.0.1:{port}", check=False)
    assert said.returncode == 2, said
    told = " ".join(said.stderr.split())
    assert f"--http 127.0.0.1:{port}: could not listen there" in told
    assert "pick another HOST:PORT" in told
    assert "the API:" not in said.stderr
    assert "corral is" not in said.stderr


def test_a_past_at_runs_with_allow_past_and_a_bare_delay_is_seconds(corral: Run) -> None:
    ran = corral("submit", "--at", "2020-01-01T00:00:00Z", "--allow-past", "--json", "--", "true")
    assert json.loads(ran.stdout)["created"] is True
    later = corral("submit", "--delay", "10", "--json", "--", "true")
    job_id = str(json.loads(later.stdout)["id"])
    shown = json.loads(corral("jobs", "show", job_id, "--json").stdout)
    assert shown["state"] == "scheduled"
