"""A job given as JSON (a line of `corral submit --from-file`) as the client's arguments."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from corral import client, config, errors
from corral.clock import SystemClock


def test_every_field_is_an_argument_of_submit_and_nothing_else_is() -> None:
    c = client.Client(store=None, executors={}, settings=config.Settings(), clock=SystemClock())  # type: ignore[arg-type]
    given = {
        "spec": {"command": ["true"]},
        "executor": "kubernetes",
        "payload": {"day": 1},
        "queue": "q",
        "pool": "p",
        "tenant": "t",
        "priority": 5,
        "max_attempts": 2,
        "idempotency_key": "k",
        "labels": {"a": "b"},
        "run_at": datetime(2026, 12, 1, tzinfo=UTC),
        "policy": {"heartbeat": True},
        "code_version": "v1",
        "flow": "api",
        "callback": "https://example.com/done",
        "failure_callback": "https://example.com/failed",
    }
    task = ("task", "task_version")  # a Python task's, instead of spec and executor
    assert tuple(given) == tuple(f for f in client.jobs.SUBMIT_FIELDS if f not in task)
    job = c.new_job(**given)  # type: ignore[arg-type]
    assert {name: getattr(job, name) for name in given} == given
    with pytest.raises(TypeError, match="unexpected keyword argument 'queu'"):
        c.new_job(spec={}, queu="q")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="'spec'"):
        c.new_job(queue="q")
    job = c.new_job(task="send-invoice", task_version=2, payload={"amount_cents": 5})
    assert (job.executor, job.spec) == ("python", {"task": "send-invoice", "version": 2})
    assert job.payload == {"task": "send-invoice", "version": 2, "data": {"amount_cents": 5}}
    assert job.policy["heartbeat"] is True  # its worker renews the lease
    with pytest.raises(errors.InvalidInput, match="task: give a task, or a spec"):
        c.new_job(task="t", spec={"command": ["true"]})


def test_a_job_as_json_becomes_the_arguments_of_submit() -> None:
    args = client.arguments.submit_arguments(
        {"spec": {"command": ["true"]}, "run_at": "2026-12-01T09:00:00+00:00", "pool": None}
    )
    assert args == {
        "spec": {"command": ["true"]},
        "run_at": datetime(2026, 12, 1, 9, tzinfo=UTC),
        "pool": None,
    }


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ([], "must be a JSON object"),
        ({"command": ["true"]}, "command: unknown field (allowed: spec"),
        ({"queue": "q"}, "spec: required"),
        ({"spec": ["true"]}, "spec: must be a JSON object"),
        ({"spec": {}, "priority": "5"}, "priority: must be a whole number"),
        ({"spec": {}, "max_attempts": True}, "max_attempts: must be a whole number"),
        ({"spec": {}, "queue": 3}, "queue: must be a string"),
        ({"spec": {}, "labels": {"a": 1}}, "labels: must be an object of strings"),
        ({"spec": {}, "run_at": "tomorrow"}, "run_at: 'tomorrow' is not an ISO 8601 time"),
        ({"spec": {}, "run_at": 5}, "run_at: must be a string"),
    ],
)
def test_a_wrong_field_is_named_with_its_rule(given: object, said: str) -> None:
    with pytest.raises(errors.InvalidInput, match=said.replace("(", r"\(")):
        client.arguments.submit_arguments(given)


def test_a_python_job_given_by_spec_must_carry_its_envelope() -> None:
    c = client.Client(store=None, executors={}, settings=config.Settings(), clock=SystemClock())  # type: ignore[arg-type]
    spec = {"task": "send-invoice", "version": 2}
    good = {"task": "send-invoice", "version": 2, "data": {"amount_cents": 5}}
    job = c.validate(c.new_job(executor="python", spec=spec, payload=good))
    assert job.payload == good
    for bad in ({"amount_cents": 5}, {**good, "version": 1}, None):
        with pytest.raises(errors.InvalidInput, match="payload: a Python task's payload is"):
            c.validate(c.new_job(executor="python", spec=spec, payload=bad))
    with pytest.raises(errors.InvalidInput, match="task_version: 0 must be"):
        c.validate(c.new_job(task="send-invoice"))  # its version is settled by task_checked
