"""Secrets in a job's spec are kept for the executor and never shown."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from corral import model, redaction, shapes

R = redaction.REDACTED


@pytest.mark.parametrize(
    ("shown", "expected"),
    [
        ({"headers": {"Authorization": "Bearer abc"}}, {"headers": {"Authorization": R}}),
        ({"headers": {"cookie": "s=1", "X-Team": "d"}}, {"headers": {"cookie": R, "X-Team": "d"}}),
        ({"headers": {"X-Api-Key": "k"}}, {"headers": {"X-Api-Key": R}}),
        ({"env": {"DB_PASSWORD": "p", "HOME": "/"}}, {"env": {"DB_PASSWORD": R, "HOME": "/"}}),
        ({"json": {"token": "t", "rows": 3}}, {"json": {"token": R, "rows": 3}}),
        ({"url": "https://u:pw@x.example/p"}, {"url": f"https://{R}@x.example/p"}),
        (
            {"url": "https://x.example/p?access_token=a&page=2#top"},
            {"url": f"https://x.example/p?access_token={R}&page=2#top"},
        ),
        (
            {"command": ["curl", "https://x.example/?sig=1&signature=2"]},
            {"command": ["curl", f"https://x.example/?sig={R}&signature={R}"]},
        ),
        (
            {"url": "https://x.example/p?q=secret-looking-value"},
            {"url": "https://x.example/p?q=secret-looking-value"},
        ),
        ({"headers": {"Authorization": ""}}, {"headers": {"Authorization": ""}}),
    ],
)
def test_secret_values_are_redacted(shown: dict[str, object], expected: dict[str, object]) -> None:
    assert redaction.redacted(shown) == expected


def test_a_job_is_shown_without_its_secrets_and_kept_whole() -> None:
    spec = {
        "method": "GET",
        "url": "https://x.example/?token=abc",
        "headers": {"Authorization": "Bearer abc"},
    }
    at = datetime(2026, 1, 1, tzinfo=UTC)
    job = model.Job(
        id=1, state=model.JobState.QUEUED, queue="default", pool=None, tenant="default",
        priority=0, executor="http", spec=spec, payload=None, attempt_count=0,
        max_attempts=3, run_at=at, idempotency_key=None, labels={},
        policy={}, code_version=None, created_at=at, updated_at=at,
    )  # fmt: skip
    shown = shapes.job_dict(job)
    assert "abc" not in repr(shown)
    assert job.spec["headers"]["Authorization"] == "Bearer abc"


SPECS = [
    {"headers": {"Authorization": "Bearer abc", "X-Team": "d"}},
    {"url": "https://u:pw@x.example/p?access_token=a&page=2&sig=s#top"},
    {"json": {"token": "t", "rows": [1, {"api_key": "k"}]}, "body": "https://u:p@x.example/"},
    {"env": {"DB_PASSWORD": "p"}, "command": ["curl", "https://x.example/?sig=1"]},
]


@pytest.mark.parametrize("stored", SPECS)
def test_what_was_shown_and_sent_back_as_it_was_is_the_stored_value(
    stored: dict[str, object],
) -> None:
    assert redaction.restored(redaction.redacted(stored), stored) == stored


def test_a_marker_keeps_its_secret_beside_what_changed_and_only_where_one_was() -> None:
    stored = {
        "url": "https://u:pw@x.example/p?token=a&token=b&page=2",
        "headers": {"Authorization": "Bearer abc", "X-Team": "d"},
    }
    sent = {
        "url": f"https://{R}@x.example/v2?page=3&token={R}&token={R}&q={R}",
        "headers": {"authorization": R, "X-Team": "e", "X-Api-Key": R},
    }
    assert redaction.restored(sent, stored) == {
        "url": f"https://u:pw@x.example/v2?page=3&token=a&token=b&q={R}",
        "headers": {"authorization": "Bearer abc", "X-Team": "e", "X-Api-Key": R},
    }
    assert redaction.restored({"url": f"https://x.example/?token={R}"}, {}) == {
        "url": f"https://x.example/?token={R}"
    }
