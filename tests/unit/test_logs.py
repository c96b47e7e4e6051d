"""corral's log handlers: no URL secret in any record, one line a record off a terminal,
JSON lines on request."""

from __future__ import annotations

import io
import json
import logging

import pytest

from corral import logs

URL = "https://ada:hunter2@api.example.com/v1/hook?page=2&access_token=tok123&sig=abc"


@pytest.fixture
def logger() -> logging.Logger:
    made = logging.getLogger("corral.test-logs")
    made.propagate = False
    made.setLevel(logging.DEBUG)
    yield made
    made.handlers.clear()


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_url_is_redacted_in_every_record(logger: logging.Logger, log_format: str) -> None:
    out = io.StringIO()
    logger.addHandler(logs.handler(log_format, out))
    logger.info("HTTP Request: POST %s %r", URL, "HTTP/1.1 200 OK")
    try:
        raise RuntimeError(f"could not reach {URL}")
    except RuntimeError:
        logger.exception("failed")
    written = out.getvalue()
    for secret in ("hunter2", "tok123", "abc"):
        assert secret not in written
    assert "page=2" in written
    assert "api.example.com" in written
    lines = written.splitlines()
    if log_format == "json":
        records = [json.loads(line) for line in lines]
        assert [r["level"] for r in records] == ["INFO", "ERROR"]
        assert "Traceback" in records[1]["traceback"]
    else:
        assert lines[0].endswith("'HTTP/1.1 200 OK'")  # one line, never wrapped
        assert " INFO corral.test-logs: HTTP Request: POST https://[redacted]@" in lines[0]


def test_the_http_client_s_own_request_lines_are_not_written() -> None:
    out = io.StringIO()
    logs.setup("DEBUG", "text", out)
    try:
        logging.getLogger("httpx").info("HTTP Request: GET %s", URL)
        logging.getLogger("corral.x").debug("kept")
    finally:
        logging.basicConfig(force=True, handlers=[logging.NullHandler()])
    assert "HTTP Request" not in out.getvalue()
    assert "kept" in out.getvalue()


def test_log_format_is_a_setting_and_an_option_of_each_loop_command() -> None:
    import click
    from click.testing import CliRunner

    from corral.cli import common, loops, workers

    @click.command()
    @common.log_format_option
    @click.pass_obj
    def loop(state: common.State) -> None:
        click.echo(state.settings(check_chain=False).log_format)

    ran = CliRunner().invoke(loop, ["--log-format", "json"], obj=common.State(None))
    assert ran.output.strip() == "json", ran.output
    assert CliRunner().invoke(loop, [], obj=common.State(None)).output.strip() == "text"
    commands = (loops.serve, loops.api_cmd, loops.dispatcher_cmd, loops.reconciler_cmd,
                loops.scheduler_cmd, loops.alerter_cmd, workers.worker_cmd)  # fmt: skip
    for command in commands:
        assert "--log-format" in {o for p in command.params for o in p.opts}, command.name
