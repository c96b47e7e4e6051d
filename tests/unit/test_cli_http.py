"""`--http METHOD URL` and its options, as `corral submit` and `corral schedules add` read them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from corral import errors
from corral.cli.job_options import JobOptions


def arguments(command: tuple[str, ...] = (), **given: Any) -> dict[str, Any]:
    return JobOptions(**given).arguments(command)


def test_http_makes_the_spec_and_the_executor(tmp_path: Path) -> None:
    body = tmp_path / "body.txt"
    body.write_text("a=1")
    args = arguments(
        http_request=("post", "https://example.com/hook"),
        header_lines=("X-Team: data", "Accept:application/json"),
        data=f"@{body}",
        expect="200,204",
    )
    assert args["executor"] == "http"
    assert args["spec"] == {
        "method": "post",
        "url": "https://example.com/hook",
        "headers": {"X-Team": "data", "Accept": "application/json"},
        "body": "a=1",
        "expect": "200,204",
    }
    assert arguments(http_request=("PUT", "https://x.example"), json_body='{"a": [1]}')["spec"][
        "json"
    ] == {"a": [1]}


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"header_lines": ("X: 1",)}, "--header: only with --http METHOD URL"),
        ({"expect": "2xx", "data": "x"}, "--data, --expect: only with --http METHOD URL"),
        (
            {"http_request": ("GET", "https://x.example"), "header_lines": ("no colon",)},
            "--header 'no colon': write it as 'Name: value'",
        ),
        (
            {"http_request": ("GET", "https://x.example"), "data": "x", "json_body": "{}"},
            "--data and --json-body: give one body, not both",
        ),
        (
            {"http_request": ("GET", "https://x.example"), "json_body": "{nope"},
            "--json-body: not valid JSON",
        ),
        (
            {"http_request": ("GET", "https://x.example"), "data": "@/no/such/file"},
            "--data @/no/such/file: cannot read it",
        ),
        (
            {"http_request": ("GET", "https://x.example"), "executor": "kubernetes"},
            "--http runs on --executor http, not kubernetes",
        ),
        (
            {"http_request": ("GET", "https://x.example"), "spec_json": "{}"},
            "--http is the whole job",
        ),
    ],
)
def test_http_options_that_cannot_be_read_are_refused(given: dict[str, Any], message: str) -> None:
    with pytest.raises(errors.InvalidInput, match=message.replace("(", r"\(").replace(")", r"\)")):
        arguments(**given)


def test_a_command_with_http_is_refused() -> None:
    with pytest.raises(errors.InvalidInput, match="--http is the whole job"):
        arguments(("echo", "hi"), http_request=("GET", "https://x.example"))


def test_a_header_given_twice_is_refused_and_an_empty_body_is_kept() -> None:
    with pytest.raises(errors.InvalidInput, match="--header x-a: given twice"):
        arguments(http_request=("GET", "https://x.example"), header_lines=("X-A: 1", "x-a: 2"))
    with pytest.raises(errors.InvalidInput, match="--data: only with --http"):
        arguments(data="")
    assert arguments(http_request=("POST", "https://x.example"), data="")["spec"]["body"] == ""


def test_sla_goes_into_the_policy_and_a_bad_one_is_refused_naming_the_option() -> None:
    assert arguments(("true",), sla="15m")["policy"] == {"sla": "15m"}
    with pytest.raises(errors.InvalidInput, match="--sla"):
        arguments(("true",), sla="soon")
    with pytest.raises(errors.InvalidInput, match="--sla and --policy sla"):
        arguments(("true",), sla="15m", policy_json='{"sla": "1h"}')
