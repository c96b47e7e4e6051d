"""A job given as JSON (a line of `corral submit --from-file`) as the client's arguments."""

from __future__ import annotations

import inspect
from datetime import UTC, datetime

import pytest

from corral import client, errors


def test_the_fields_are_the_arguments_of_submit() -> None:
    names = [n for n in inspect.signature(client.Client.submit).parameters if n != "self"]
    assert tuple(names) == client.SUBMIT_FIELDS


def test_a_job_as_json_becomes_the_arguments_of_submit() -> None:
    args = client.submit_arguments(
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
        client.submit_arguments(given)
