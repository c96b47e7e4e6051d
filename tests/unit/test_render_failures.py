"""`corral jobs show` says a failed request's message: the first line of its response."""

from __future__ import annotations

from corral import launching
from corral.cli import render
from corral.executors import http_outcome


def test_a_failed_request_s_message_is_the_first_line_of_its_body() -> None:
    outcome = http_outcome.Outcome(
        status=503,
        reason_phrase="Service Unavailable",
        headers=(("content-type", "text/plain"),),
        body=b"\n  upstream is down for maintenance  \nsecond line\n",
    )
    log = http_outcome.run_log(None, outcome)
    assert render.failure_message(log) == "upstream is down for maintenance"
    assert (
        render.failure_message(http_outcome.run_log(None, http_outcome.Outcome(status=500))) is None
    )
    quiet = launching.RunLog(streams=(launching.Stream("stdout", "hi\n\nthere", 9),))
    assert render.failure_message(quiet) is None  # a command's: its streams say it
    assert render.failure_message(None) is None
