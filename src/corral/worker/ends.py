"""What a task's run ends as: the attempt's Finish, with a run log of the fresh values it
resolved and, for a failure, its traceback (cut to launching.STREAM_BYTES). A failure's reason
is the exception's type and first line.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Mapping
from typing import Any

from corral import callbacks, clock, launching, model, redaction
from corral.store import Finish

A = model.AttemptState


def said(exc: BaseException) -> str:
    """A failure's reason: the exception's type and the first line of what it says."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def jsonable(values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` as JSON has them (what JSON cannot hold, as text)."""
    out: dict[str, Any] = json.loads(json.dumps(dict(values), default=str))
    return out


def run_log(
    started: float,
    fresh: Mapping[str, Any],
    clk: clock.Clock,
    exc: BaseException | None = None,
    *,
    returned: Any = None,
) -> launching.RunLog:
    """The run log of a run that began at `started` (clock.monotonic): the fresh values
    it resolved (redacted), the traceback of `exc` when it raised one, and for a callback
    what it `returned` (`returned`)."""
    streams = []
    if fresh:
        text = json.dumps(redaction.redacted(jsonable(fresh)), sort_keys=True)
        streams.append(launching.Stream("fresh", text, len(text.encode())))
    if exc is not None:
        whole = "".join(traceback.format_exception(exc))
        text = whole[-launching.STREAM_BYTES :]
        streams.append(launching.Stream("traceback", text, len(whole.encode()), cut=text != whole))
    return launching.RunLog(
        streams=tuple(streams), latency=clk.monotonic() - started, result=_returned(returned)
    )


def _returned(value: Any) -> dict[str, Any] | None:
    """What a callback sends of a task's return value (corral.callbacks): the value as JSON
    (what JSON cannot hold, as text), when it returned one; past callbacks.OUTPUT_BYTES, its
    size instead."""
    if value is None:
        return None
    try:
        text = json.dumps(value, default=str)
    except ValueError as exc:  # a value that holds itself
        return {"returned_error": f"not JSON: {exc}"}
    if len(text.encode()) > callbacks.OUTPUT_BYTES:
        return {"returned_bytes": len(text.encode())}
    return {"returned": json.loads(text)}


def failed(
    fence: int,
    why: str,
    cls: model.FailureClass | None,
    started: float,
    fresh: Mapping[str, Any],
    clk: clock.Clock,
    exc: BaseException | None = None,
) -> Finish:
    """The end of a failed run: `why` its reason, `cls` its class when the worker knows it
    (else the job's rules judge it), with its run log."""
    return Finish(
        fence,
        A.FAILED,
        None,
        why,
        failure_class=cls,
        message=why,
        output=run_log(started, fresh, clk, exc),
    )
