"""`--expect-body`, `--expect-json` and `--max-response-time` as a user runs them: on
`corral submit` and `corral schedules add|update`, kept in the job's spec in their normal
form, and every malformed one refused at submit naming the field, nothing stored."""

from __future__ import annotations

import json

import pytest

from tests.support.cli import Run

URL = "https://example.com/health"


def test_assertions_go_into_a_job_s_and_a_schedule_s_spec(corral: Run) -> None:
    job_id = corral(
        "submit",
        "--http",
        "GET",
        URL,
        "--expect-body",
        '"status": *"up"',
        "--expect-json",
        "$.ok==true",
        "--expect-json",
        "$.replicas[0].lag_seconds < 5",
        "--max-response-time",
        "2000ms",
    ).stdout.strip()
    spec = json.loads(corral("jobs", "show", job_id, "--json").stdout)["spec"]
    assert spec["expect_body"] == '"status": *"up"'
    assert spec["expect_json"] == ["$.ok == true", "$.replicas[0].lag_seconds < 5"]
    assert spec["max_response_time"] == "2s"

    corral("schedules", "add", "health", "--every", "1m", "--http", "GET", URL)
    corral(
        "schedules",
        "update",
        "health",
        "--http",
        "GET",
        URL,
        "--expect-json",
        '$.status == "up"',
    )
    shown = json.loads(corral("schedules", "show", "health", "--json").stdout)
    assert shown["template"]["spec"]["expect_json"] == ['$.status == "up"']


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--expect-json", "$.ok = true"], "http spec: expect_json: '$.ok = true': after the path"),
        (["--expect-json", "ok == true"], "http spec: expect_json: 'ok == true': a path starts"),
        (["--expect-json", "$.n > true"], "> compares numbers or strings, not true"),
        (["--expect-body", "(?<=x)y"], "http spec: expect_body: invalid perl operator"),
        (["--max-response-time", "soon"], "http spec: max_response_time: 'soon' is not a duration"),
    ],
)
def test_a_malformed_assertion_is_refused_at_submit_naming_the_field(
    corral: Run, args: list[str], message: str
) -> None:
    proc = corral("submit", "--http", "GET", URL, *args, check=False)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert json.loads(corral("jobs", "list", "--json").stdout) == []


def test_an_assertion_without_http_is_refused(corral: Run) -> None:
    proc = corral("submit", "--expect-json", "$.ok == true", "--", "true", check=False)
    assert proc.returncode == 2
    assert "--expect-json: only with --http METHOD URL" in proc.stderr
