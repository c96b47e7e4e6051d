"""Callbacks, pure: where each end sends its result, what the result says, and the edge's
checks of a callback URL (refused naming the field, as an HTTP job's URL is)."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from corral import callbacks, client, config, errors, launching, model, plain, scheduling
from corral.clock import SystemClock
from corral.executors import http, http_outcome
from corral.worker import ends
from tests.support.noop import NoopExecutor

J = model.JobState
NOW = datetime(2026, 12, 8, 9, 30, tzinfo=UTC)


def _job(**given: Any) -> model.Job:
    fields: dict[str, Any] = {
        "id": 7,
        "tenant": "acme",
        "queue": "reports",
        "pool": None,
        "priority": 3,
        "executor": "process",
        "spec": {"command": ["true"]},
        "payload": None,
        "state": J.RUNNING,
        "run_at": NOW,
        "idempotency_key": None,
        "max_attempts": 3,
        "attempt_count": 1,
        "labels": {},
        "created_at": NOW,
        "updated_at": NOW,
        "callback": "https://example.com/ok",
        "failure_callback": "https://example.com/failed",
    }
    return model.Job(**{**fields, **given})


@pytest.mark.parametrize(
    ("state", "url"),
    [
        (J.SUCCEEDED, "https://example.com/ok"),
        (J.FAILED, "https://example.com/failed"),
        (J.QUARANTINED, "https://example.com/failed"),
        (J.CANCELLED, None),
        (J.QUEUED, None),
    ],
)
def test_each_end_sends_to_its_url(state: model.JobState, url: str | None) -> None:
    assert callbacks.target(_job(), state) == url
    assert callbacks.target(_job(callback_of=3), state) is None, "a callback has none"
    assert callbacks.target(_job(callback=None, failure_callback=None), state) is None


def test_the_callback_job_posts_the_result_in_the_jobs_tenant_and_queue() -> None:
    firing = {"corral": {"schedule": "nightly", "nominal_time": "2026-12-08T09:00:00Z"}}
    out = launching.RunLog(
        streams=(launching.Stream("stdout", "é" + "x" * 70_000, 70_002, cut=False),),
        latency=1.5,
    )
    ended = callbacks.Ended(_job(payload=firing), J.SUCCEEDED, 41, 1, 0, None, "exit 0", out)
    new = callbacks.callback_job(ended, NOW)
    assert new is not None
    assert (new.executor, new.tenant, new.queue, new.priority) == ("http", "acme", "reports", 3)
    assert new.spec["method"] == "POST"
    assert new.labels == {"callback-of": "7"}
    assert (new.callback, new.failure_callback, new.callback_of) == (None, None, 7)
    assert new.idempotency_key == "callback:7:41"
    body = new.payload
    assert body["schedule"] == "nightly"
    assert body["nominal_time"] == "2026-12-08T09:00:00Z"
    assert (body["exit_code"], body["status"], body["response_time"]) == (0, None, 1.5)
    assert body["ended_at"] == "2026-12-08T09:30:00Z"
    stdout = body["output"]["stdout"]
    assert len(stdout.encode()) == callbacks.OUTPUT_BYTES  # its last 64 KiB
    assert body["output"]["stdout_cut"] is True
    json.dumps(body)  # it is JSON


def test_an_http_result_carries_headers_and_the_first_64_kib_of_the_body() -> None:
    outcome = http_outcome.Outcome(
        201, "Created", "93.184.216.34", 0.05, bytes(range(256)) * 300, headers=(("X-A", "1"),)
    )
    result = http_outcome.run_log(None, outcome).result
    assert result is not None
    kept = base64.b64decode(result["body_base64"])
    assert kept == (bytes(range(256)) * 300)[: callbacks.OUTPUT_BYTES]
    assert result["body_cut"] is True
    assert result["headers"] == {"x-a": "1"}
    assert http_outcome.run_log(None, http_outcome.Outcome(error="refused")).result is None


def test_what_a_database_cannot_hold_of_a_result_is_mended() -> None:
    """A NUL of binary stdout, a task's returned NUL, lone surrogate or NaN, a reason with a
    NUL: each becomes what PostgreSQL's JSONB holds (U+FFFD; NaN as text), so the result
    can be the callback job's payload in the transaction that ends the job."""
    clk = SystemClock()
    returned = {"k\x00": ["a\x00b", "\ud800", float("nan")], "n": 1}
    log = ends.run_log(clk.monotonic(), {}, clk, returned=returned)
    out = launching.RunLog(
        streams=(launching.Stream("stdout", "bin\x00ary\n", 8),), result=log.result
    )
    ended = callbacks.Ended(_job(), J.SUCCEEDED, 41, 1, 0, None, "said \x00", out)
    body = callbacks.body(ended, NOW)
    assert body["output"]["stdout"] == "bin\ufffdary\n"
    assert body["output"]["returned"] == {"k\ufffd": ["a\ufffdb", "\ufffd", "NaN"], "n": 1}
    assert body["reason"] == "said \ufffd"
    assert plain.refusal(body) is None
    json.dumps(body, allow_nan=False).encode()  # strict JSON, and UTF-8 throughout


def test_a_tasks_return_value_is_its_result_as_json() -> None:
    clk = SystemClock()
    assert ends.run_log(clk.monotonic(), {}, clk, returned={"rows": 3}).result == {
        "returned": {"rows": 3}
    }
    assert ends.run_log(clk.monotonic(), {}, clk).result is None
    big = ends.run_log(clk.monotonic(), {}, clk, returned="x" * 70_000).result
    assert big == {"returned_bytes": 70_002}


def _client(**settings: Any) -> client.Client:
    s = config.Settings(**settings)
    checks = {"http": http.SpecCheck(s), "process": http.SpecCheck(s)}
    return client.Client(store=None, executors=checks, settings=s, clock=SystemClock())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "url", "rule"),
    [
        ("callback", "ftp://example.com/x", "must start with http:// or https://"),
        ("failure_callback", "not a url", "must"),
        ("callback", "http://127.0.0.1:9/x", "loopback address"),
        ("failure_callback", "http://169.254.169.254/", "link-local address"),
        ("callback", "https://example.com/{{job}}", r"holds a placeholder \({{...}}\)"),
        ("failure_callback", "https://example.com/?to={{ state }}", "holds a placeholder"),
    ],
)
def test_a_bad_callback_is_refused_naming_the_field(field: str, url: str, rule: str) -> None:
    c = _client()
    job = c.new_job(executor="http", spec={"url": "https://example.com/"}, **{field: url})  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidInput, match=f"^{field}: .*{rule}"):
        c.validate(job)


def test_a_callback_the_guard_opens_or_names_a_host_is_taken() -> None:
    c = _client(executors={"http": {"allow_networks": ["127.0.0.1:9"]}})
    job = c.new_job(
        executor="http",
        spec={"url": "https://example.com/"},
        callback="http://127.0.0.1:9/x",
        failure_callback="https://hooks.example.com/y",
    )
    assert c.validate(job).callback == "http://127.0.0.1:9/x"


def test_a_callback_needs_the_http_executor() -> None:
    s = config.Settings()
    noop = NoopExecutor()
    c = client.Client(store=None, executors={"noop": noop}, settings=s, clock=SystemClock())  # type: ignore[arg-type]
    job = c.new_job(executor="noop", spec={}, callback="https://example.com/")
    with pytest.raises(errors.InvalidInput, match="^callback: .*http executor"):
        c.validate(job)


def test_a_schedules_callbacks_are_each_firings_jobs() -> None:
    new = model.NewJob(executor="http", spec={}, callback="https://example.com/ok")
    template = scheduling.job_template(new)
    assert template["callback"] == "https://example.com/ok"
    assert "failure_callback" not in template  # a template keeps only what it has
    fired = scheduling.job_from_template(template, run_at=NOW)
    assert (fired.callback, fired.failure_callback) == ("https://example.com/ok", None)
