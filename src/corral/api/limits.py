"""What the API takes of a request before any route sees it: a body of at most MAX_BODY
bytes, however it is sent (with a Content-Length or in chunks without one), a path, query
and form without NUL characters, and a JSON body with no string a database cannot hold (a
NUL or a lone surrogate, which only JSON's escapes can carry: corral.plain)."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral import plain

MAX_BODY = 1024 * 1024
"""The largest request body taken, in bytes (a submit of many jobs included)."""

Error = Callable[[int, str], JSONResponse]


class RequestLimits:
    """ASGI middleware: 413 for a body past MAX_BODY, 422 for a NUL in the path or query;
    `error(status, message)` makes the answer."""

    def __init__(self, app: ASGIApp, *, error: Error) -> None:
        self.app = app
        self.error = error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        wrong = _nul(scope)
        refused = None if wrong is None else self.error(422, wrong)
        headers = Headers(scope=scope)
        kind = headers.get("content-type", "").partition(";")[0].strip().lower()
        looked = kind == "application/json" or kind.endswith("+json") or kind == _FORM
        if refused is None:
            size = headers.get("content-length")
            if size is not None and (
                not (size.isascii() and size.isdigit()) or int(size) > MAX_BODY
            ):
                refused = self.error(413, f"body: at most {MAX_BODY} bytes")
            elif size is None or (looked and int(size) > 0):
                # Read here (counting, when chunked), looked at, and handed on.
                messages = await _read(receive)
                if messages is None:
                    refused = self.error(413, f"body: at most {MAX_BODY} bytes")
                else:
                    receive = _replay(messages, receive)
                    if looked and (wrong := _unstorable(kind, _body(messages))) is not None:
                        refused = self.error(422, wrong)
        if refused is not None:
            await refused(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _nul(scope: Scope) -> str | None:
    """What is wrong with the path or query, if either holds a NUL character."""
    if "\x00" in scope.get("path", ""):
        return "path: must not hold a NUL character"
    query = scope.get("query_string", b"").decode("latin-1")
    for key, value in parse_qsl(query, keep_blank_values=True):
        if "\x00" in key or "\x00" in value:
            return f"{key.replace(chr(0), '') or 'query'}: must not hold a NUL character"
    return None


_FORM = "application/x-www-form-urlencoded"

_ESCAPED = re.compile(rb"\\u(?:[dD][89a-fA-F][0-9a-fA-F]{2}|0000)")
"""A JSON escape of a surrogate or of NUL: what a body must hold for either to be in it
(neither can be written raw in valid JSON), so only such a body is parsed here."""


def _body(messages: list[Message]) -> bytes:
    return b"".join(m.get("body", b"") for m in messages if m["type"] == "http.request")


def _unstorable(kind: str, body: bytes) -> str | None:
    """What is wrong with a JSON or form body that a database could not hold, if anything
    (a body that is not JSON is the route's to refuse)."""
    if kind == _FORM:
        for key, value in parse_qsl(body.decode("latin-1"), keep_blank_values=True):
            if "\x00" in key or "\x00" in value:
                return f"{key.replace(chr(0), '') or 'body'}: must not hold a NUL character"
        return None
    if not _ESCAPED.search(body):
        return None
    try:
        given = json.loads(body)
    except ValueError:
        return None
    return plain.refusal(given)


async def _read(receive: Receive) -> list[Message] | None:
    """The request's messages up to its body's end; None once past MAX_BODY."""
    messages: list[Message] = []
    size = 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages  # the client went away: the app sees it so
        size += len(message.get("body", b""))
        if size > MAX_BODY:
            return None
        if not message.get("more_body", False):
            return messages


def _replay(messages: list[Message], receive: Receive) -> Callable[[], Awaitable[Any]]:
    """A receive that gives `messages` first, then what `receive` gives."""
    pending = list(messages)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed
