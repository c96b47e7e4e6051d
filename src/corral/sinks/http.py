"""A fence guard for services that receive corral's HTTP calls (or any writes from jobs).

Each call from an attempt carries `Corral-Fence` (and `Corral-Job-Id`, `Idempotency-Key`).
The guard keeps, per resource key, the newest fence it has seen, in a table of the
service's own database, and refuses a call whose fence is older: one statement decides,
so two callers at once cannot both pass with the older fence winning.

    from corral.sinks.http import FenceGuard, FenceMiddleware

    guard = FenceGuard("postgresql+psycopg://svc@db/svc")
    app = FenceMiddleware(app, guard)                       # any ASGI app
    # or, in a handler: guard.admit("orders/2026-11-30", fence)  -> False when stale

The middleware guards unsafe methods (POST, PUT, PATCH, DELETE) keyed by the request path
(or `key(scope)`), answers a stale call with 409 and a JSON body naming both fences, and
lets calls without the header through (or answers 428 with `require=True`). It decides
which calls get in, before the handler runs: an older call admitted first and slow to
write can still land after a newer one. Where that matters, check inside the handler's
own transaction with `guard.newest_if_stale_in(conn, resource, fence)`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from corral import errors
from corral.worker import CurrentAttempt, current_attempt

FENCE_HEADER = "corral-fence"
JOB_HEADER = "corral-job-id"
IDEMPOTENCY_HEADER = "idempotency-key"
UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def fence_headers(
    attempt: CurrentAttempt | None = None, *, idempotency_key: str | None = None
) -> dict[str, str]:
    """The headers a call from an attempt carries, for a guarded service to check:
    `Corral-Fence`, `Corral-Job-Id` and `Idempotency-Key` (default: job and attempt, the
    same on every retry of this attempt's call)."""
    attempt = attempt or current_attempt()
    return {
        "Corral-Fence": str(attempt.fence),
        "Corral-Job-Id": str(attempt.job_id),
        "Idempotency-Key": idempotency_key or f"corral-{attempt.job_id}-{attempt.attempt_no}",
    }


class FenceGuard:
    """The newest fence seen per resource key, in table `table` (created if missing)."""

    def __init__(self, engine: sa.Engine | str, *, table: str = "corral_fences") -> None:
        self.engine = sa.create_engine(engine) if isinstance(engine, str) else engine
        if self.engine.dialect.name not in ("sqlite", "postgresql"):
            raise errors.ConfigError(f"FenceGuard: {self.engine.dialect.name} is not supported")
        meta = sa.MetaData()
        self.table = sa.Table(
            table,
            meta,
            sa.Column("resource", sa.Text, primary_key=True),
            sa.Column("fence", sa.BigInteger, nullable=False),
        )
        try:
            meta.create_all(self.engine)
        except sa.exc.DBAPIError:  # another replica created it at the same moment
            if not sa.inspect(self.engine).has_table(table):
                raise

    def close(self) -> None:
        """Close the guard's database connections."""
        self.engine.dispose()

    def admit(self, resource: str, fence: int) -> bool:
        """Record `fence` for `resource` and return True, unless a newer one was seen."""
        return self.newest_if_stale(resource, fence) is None

    def newest_if_stale(self, resource: str, fence: int) -> int | None:
        """None when `fence` is admitted (the newest or the same), else the newer fence."""
        with self.engine.begin() as conn:
            return self.newest_if_stale_in(conn, resource, fence)

    def newest_if_stale_in(self, conn: sa.Connection, resource: str, fence: int) -> int | None:
        """`newest_if_stale` inside your own transaction: call it in the transaction that
        writes, and the resource's row stays locked until it commits, so an older call
        cannot land its write after a newer one's."""
        dialect = postgresql if self.engine.dialect.name == "postgresql" else sqlite
        insert = dialect.insert(self.table).values(resource=resource, fence=fence)
        stmt = insert.on_conflict_do_update(
            index_elements=[self.table.c.resource],
            set_={"fence": insert.excluded.fence},
            where=self.table.c.fence <= insert.excluded.fence,
        ).returning(self.table.c.resource)
        if conn.execute(stmt).first() is not None:
            return None
        held = conn.execute(
            sa.select(self.table.c.fence).where(self.table.c.resource == resource)
        ).scalar_one()
        return int(held)


class FenceMiddleware:
    """ASGI middleware: refuses writes that carry a stale `Corral-Fence`."""

    def __init__(
        self,
        app: App,
        guard: FenceGuard,
        *,
        key: Callable[[Scope], str] | None = None,
        require: bool = False,
    ) -> None:
        self.app = app
        self.guard = guard
        self.key = key or (lambda scope: str(scope.get("path", "/")))
        self.require = require

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or scope.get("method") not in UNSAFE:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        raw = headers.get(FENCE_HEADER)
        if raw is None:
            if self.require:
                await _answer(send, 428, {"error": "Corral-Fence header required"})
                return
            await self.app(scope, receive, send)
            return
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 18):
            await _answer(send, 400, {"error": f"Corral-Fence: not a fence number: {raw!r}"})
            return
        fence, resource = int(raw), self.key(scope)
        # The guard's database call blocks: off the event loop.
        newer = await asyncio.to_thread(self.guard.newest_if_stale, resource, fence)
        if newer is not None:
            await _answer(
                send,
                409,
                {
                    "error": "stale fence: a newer attempt has written here",
                    "resource": resource,
                    "fence": fence,
                    "newer": newer,
                    "job_id": headers.get(JOB_HEADER),
                },
            )
            return
        await self.app(scope, receive, send)


async def _answer(send: Send, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(data)),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


def verify_signature(
    body: bytes | str, headers: Mapping[str, str], secrets: str | Sequence[str]
) -> None:
    """Check that corral signed this request (Standard Webhooks: webhook-id,
    webhook-timestamp within five minutes of now, webhook-signature over
    `id.timestamp.body`) with one of `secrets` (the tenant's, from `corral secrets create`;
    during a rotation, the old and the new). Raise SignatureInvalid, saying why, if not.
    Read the body as it came, before parsing it.

        from corral.sinks.http import verify_signature
        verify_signature(await request.body(), request.headers, os.environ["CORRAL_SECRET"])
    """
    from standardwebhooks.webhooks import Webhook, WebhookVerificationError

    keys = [secrets] if isinstance(secrets, str) else list(secrets)
    if not keys:
        raise errors.SignatureInvalid("no secret to verify with")
    plain = {k.lower(): v for k, v in headers.items()}
    why = "no secret given"
    for key in keys:
        try:
            Webhook(key).verify(body, plain, json_parse=False)
            return
        except WebhookVerificationError as exc:
            why = str(exc)
        except (ValueError, UnicodeDecodeError) as exc:  # a malformed header, a binary body
            why = f"malformed: {exc}"
    raise errors.SignatureInvalid(f"not signed by corral with this secret: {why}")
