"""Python workers as a user runs them: real `corral worker` processes of examples/billing
(release 1.0 and 2.0, each started from its own folder) beside `corral submit --task`,
`corral workers`, `corral parked` and `corral preflight`, on a real SQLite file."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.test_cli import job
from tests.support.cli import Run, corral_env, run_corral
from tests.support.wait import PATIENCE, eventually_sync

BILLING = Path(__file__).resolve().parents[2] / "examples" / "billing"


def billing_env(tmp_path: Path) -> dict[str, str]:
    """The store of `tmp_path`, reached from any folder, and the example's own files."""
    return corral_env(
        {
            "CORRAL_DATABASE_URL": f"sqlite:///{tmp_path / 'corral.db'}",
            "BILLING_OUTBOX": str(tmp_path / "outbox.jsonl"),
            "BILLING_CUSTOMERS": str(tmp_path / "customers.json"),
            "BILLING_REPORTS": str(tmp_path / "reports.jsonl"),
            "PYTHONDONTWRITEBYTECODE": "1",  # nothing written into the repository's examples
        }
    )


def in_release(tmp_path: Path, release: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`corral ARGS` run from examples/billing/RELEASE, where `billing:app` imports."""
    return run_corral(BILLING / release, *args, env=billing_env(tmp_path))


def workers(corral: Run, *flags: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(corral("workers", "--json", *flags).stdout)
    return found


class Worker:
    """A `corral worker billing:app` of one release, in the background."""

    def __init__(self, tmp_path: Path, release: str) -> None:
        self.release = release
        self.log = tmp_path / f"worker-{release}-{len(list(tmp_path.glob('worker-*')))}.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "corral", "worker", "billing:app", "--concurrency", "4"],
                cwd=BILLING / release,
                env=billing_env(tmp_path),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
            )

    def output(self) -> str:
        return self.log.read_text()

    def registered(self, corral: Run) -> dict[str, Any]:
        """Wait until `corral workers` lists this process; its entry."""

        def listed() -> dict[str, Any] | None:
            assert self.proc.poll() is None, f"the worker exited:\n{self.output()}"
            return next((w for w in workers(corral) if w["pid"] == self.proc.pid), None)

        found: dict[str, Any] = eventually_sync(listed, what=f"the {self.release} worker listed")
        return found

    def stop(self) -> int:
        """SIGTERM, as a rollout sends it; its exit status."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=PATIENCE)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=PATIENCE)


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[[str], Worker]]:
    """Start a worker of a release (`v1` or `v2`); any left running is killed at the end."""
    (tmp_path / "customers.json").write_text(json.dumps({"7": {"email": "ada@example.com"}}))
    started: list[Worker] = []

    def make(release: str) -> Worker:
        started.append(Worker(tmp_path, release))
        return started[-1]

    yield make
    for worker in started:
        with contextlib.suppress(ProcessLookupError):
            worker.kill()


def submit_task(
    corral: Run, payload: dict[str, Any], *options: str
) -> subprocess.CompletedProcess[str]:
    return corral(
        "submit", "--task", "send-invoice", *options, "--payload", json.dumps(payload), check=False
    )


def jobs(corral: Run) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(corral("jobs", "list", "--json").stdout)
    return found


@pytest.mark.slow
def test_submit_task_is_refused_naming_why_and_a_v2_worker_registers_runs_and_stops(
    corral: Run, start: Callable[[str], Worker], tmp_path: Path
) -> None:
    alone = submit_task(corral, {"customer_id": 7, "amount_cents": 1250})
    assert alone.returncode == 2, alone.stderr
    assert "no live worker has registered task 'send-invoice'" in alone.stderr
    assert "--task-version" in alone.stderr, "it says how to submit anyway"

    worker = start("v2")
    me = worker.registered(corral)
    assert set(me) == {
        "id",
        "app",
        "app_version",
        "host",
        "pid",
        "queues",
        "concurrency",
        "state",
        "started_at",
        "last_seen_at",
        "stopped_at",
        "reads",
    }
    assert (me["app"], me["app_version"], me["state"]) == ("billing", "2.0.0", "running")
    assert (me["queues"], me["concurrency"], me["stopped_at"]) == ([], 4, None)
    invoice = [(r["version"], r["newest"]) for r in me["reads"] if r["task"] == "send-invoice"]
    assert invoice == [(1, False), (2, True)], "its own version, and 1 through the upcaster"
    assert all(set(r) == {"task", "version", "newest"} for r in me["reads"])

    wrong_type = submit_task(corral, {"customer_id": 7, "amount_cents": "lots"})
    assert wrong_type.returncode == 2
    assert "payload.data.amount_cents: 'lots' is not of type 'integer'" in wrong_type.stderr
    assert "task send-invoice version 2's schema" in wrong_type.stderr
    missing = submit_task(corral, {"customer_id": 7, "amount": 12.5})
    assert missing.returncode == 2
    assert "payload.data: 'amount_cents' is a required property" in missing.stderr
    old_shape = submit_task(corral, {"customer_id": 7}, "--task-version", "1")
    assert old_shape.returncode == 2
    assert "payload.data: 'amount' is a required property" in old_shape.stderr
    assert jobs(corral) == [], "a refused submit stores nothing"

    job_id = submit_task(corral, {"customer_id": 7, "amount_cents": 1250}).stdout.strip()
    eventually_sync(lambda: job(corral, job_id)["state"] == "succeeded", what="the invoice sent")
    sent = [json.loads(line) for line in (tmp_path / "outbox.jsonl").read_text().splitlines()]
    assert sent == [{"customer": 7, "cents": 1250, "email": "ada@example.com", "by": "2.0.0"}]

    assert worker.stop() == 0, worker.output()
    assert workers(corral) == [], "a stopped worker is not live"
    (gone,) = workers(corral, "--all")
    assert (gone["id"], gone["state"]) == (me["id"], "stopped")
    assert gone["stopped_at"] is not None


@pytest.mark.slow
def test_after_a_rollback_a_v2_payload_parks_under_v1_and_a_person_can_release_it(
    corral: Run, start: Callable[[str], Worker]
) -> None:
    newer = start("v2")
    newer.registered(corral)
    assert newer.stop() == 0, newer.output()
    older = start("v1")  # the rollback
    older.registered(corral)

    made = submit_task(corral, {"customer_id": 7, "amount_cents": 1999}, "--task-version", "2")
    assert made.returncode == 0, made.stderr
    job_id = int(made.stdout)
    (parked,) = json.loads(corral("parked", "list", "--json").stdout)
    assert set(parked) == {
        "job_id",
        "tenant",
        "queue",
        "task",
        "version",
        "needs_app_version",
        "parked_at",
        "reason",
    }
    assert (parked["job_id"], parked["task"], parked["version"]) == (job_id, "send-invoice", 2)
    assert parked["needs_app_version"] == "2.0.0", "the release that read it before"
    assert (parked["tenant"], parked["queue"]) == ("default", "default")
    assert "no attempt spent" in parked["reason"]
    assert parked["parked_at"] is not None
    assert job(corral, str(job_id))["attempts"] == 0
    assert json.loads(corral("parked", "list", "--task", "export-report", "--json").stdout) == []

    released = json.loads(corral("parked", "release", str(job_id), "--json").stdout)
    assert released == {"released": [job_id]}
    assert job(corral, str(job_id))["state"] == "queued"
    again = corral("parked", "release", str(job_id))
    assert f"not parked (left alone): {job_id}" in again.stderr

    assert older.stop() == 0, older.output()
    shown = job(corral, str(job_id))
    assert (shown["state"], shown["attempts"]) == ("queued", 0), "released: not parked again"


def test_preflight_names_the_version_release_1_cannot_read_and_passes_release_2(
    corral: Run, tmp_path: Path
) -> None:
    made = submit_task(corral, {"customer_id": 7, "amount_cents": 1999}, "--task-version", "2")
    assert made.returncode == 0, made.stderr  # no worker ever read version 2: parked

    v1 = in_release(tmp_path, "v1", "preflight", "billing:app")
    assert v1.returncode == 1, v1.stderr
    assert "send-invoice v2: 1 parked: billing 1.0.0 CANNOT read it" in v1.stderr
    as_json = json.loads(in_release(tmp_path, "v1", "preflight", "billing:app", "--json").stdout)
    assert (as_json["app"], as_json["app_version"], as_json["ok"]) == ("billing", "1.0.0", False)
    assert as_json["payloads"] == [
        {
            "task": "send-invoice",
            "version": 2,
            "counts": {"parked": 1},
            "readable": False,
            "reads": [1],
        }
    ]

    v2 = in_release(tmp_path, "v2", "preflight", "billing:app")
    assert v2.returncode == 0, v2.stderr
    assert "send-invoice v2: 1 parked: billing 2.0.0 reads it" in v2.stderr
    assert "billing 2.0.0 reads every payload in the store" in v2.stderr
