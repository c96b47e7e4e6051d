"""The HTTP fence guard on both databases, and its ASGI middleware driven as a server
would drive it (scope, receive, send)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from corral.sinks.http import FenceGuard, FenceMiddleware, fence_headers
from corral.worker import CurrentAttempt


@pytest.fixture
def guard(user_db_url: str) -> Iterator[FenceGuard]:
    g = FenceGuard(user_db_url)
    yield g
    g.close()


def test_the_guard_admits_the_newest_and_the_same_fence_only(guard: FenceGuard) -> None:
    assert guard.admit("orders/1", 7)
    assert guard.admit("orders/1", 8)
    assert guard.admit("orders/1", 8), "the same attempt again"
    assert not guard.admit("orders/1", 7)
    assert guard.newest_if_stale("orders/1", 6) == 8
    assert guard.admit("orders/2", 1), "each resource has its own fence"


async def call(app: Any, method: str, path: str, headers: dict[str, str]) -> tuple[int, Any]:
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], json.loads(body) if body else None


async def service(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b'{"ok": true}'})


async def test_the_middleware_refuses_a_stale_fence_with_409(guard: FenceGuard) -> None:
    app = FenceMiddleware(service, guard)
    assert await call(app, "PUT", "/orders/1", {"Corral-Fence": "8"}) == (200, {"ok": True})
    status, body = await call(app, "PUT", "/orders/1", {"Corral-Fence": "7", "Corral-Job-Id": "3"})
    assert status == 409
    assert (body["fence"], body["newer"], body["job_id"]) == (7, 8, "3")
    assert (await call(app, "GET", "/orders/1", {"Corral-Fence": "1"}))[0] == 200, "reads pass"
    assert (await call(app, "POST", "/orders/1", {}))[0] == 200, "no header: not a corral call"
    for bad in ("abc", "²", "9" * 30):
        assert (await call(app, "POST", "/x", {"Corral-Fence": bad}))[0] == 400


async def test_the_header_can_be_required(guard: FenceGuard) -> None:
    app = FenceMiddleware(service, guard, require=True)
    assert (await call(app, "POST", "/orders/1", {}))[0] == 428


async def test_a_job_sends_headers_the_middleware_checks(guard: FenceGuard) -> None:
    app = FenceMiddleware(service, guard)
    new = fence_headers(CurrentAttempt(4, 2, 9, None, None, None))
    old = fence_headers(CurrentAttempt(4, 1, 5, None, None, None))
    assert new == {"Corral-Fence": "9", "Corral-Job-Id": "4", "Idempotency-Key": "corral-4-2"}
    assert (await call(app, "POST", "/ledger", new))[0] == 200
    assert (await call(app, "POST", "/ledger", old))[0] == 409


def test_inside_the_handlers_transaction_the_check_and_the_write_go_together(
    guard: FenceGuard,
) -> None:
    with guard.engine.begin() as conn:
        assert guard.newest_if_stale_in(conn, "ledger", 5) is None
    with guard.engine.begin() as conn:
        assert guard.newest_if_stale_in(conn, "ledger", 4) == 5
