"""Who is looking at the dashboard: the session of their cookie, the role it acts in, and
the CSRF token every form they send must carry.

The cookie holds a random secret (the store keeps its SHA-256): HttpOnly, SameSite=Lax,
and Secure when the page came over https. A POST without the session's CSRF token (a
form's `csrf` field, or htmx's `X-CSRF-Token` header) is refused with 403. The sign-in
form, sent before there is a session, carries the double of a cookie of its own instead.

Failed sign-ins are counted by client address and by (user name, address) (SignInLimits):
past their limit, one more is refused with 429 and Retry-After before its password is
hashed, so guessing (and the argon2 hashing it costs the server) stays slow, while a
name's owner elsewhere is never locked out. The client address is the peer's, or behind a
proxy of `[api] trusted_proxies` the one it forwards (corral.proxies).
"""

from __future__ import annotations

import secrets
from collections import deque
from dataclasses import dataclass, field
from typing import Annotated
from urllib.parse import parse_qs, quote

from fastapi import Depends, Request
from starlette.responses import Response

from corral import access, client, errors, proxies

COOKIE = "corral_session"
SIGN_IN_COOKIE = "corral_sign_in"
CSRF_HEADER = "x-csrf-token"


SIGN_IN_WINDOW = 60.0
"""Seconds over which failed sign-ins are counted."""
FAILURES_PER_NAME_AND_ADDRESS = 5
"""Failed sign-ins as one user name from one client address in SIGN_IN_WINDOW; past them,
that name waits there. A name alone is never locked: its owner signs in from elsewhere."""
FAILURES_PER_ADDRESS = 20
"""Failed sign-ins from one client address in SIGN_IN_WINDOW, as any name or with a token;
past them, the address waits."""
KEYS_KEPT = 10_000
"""Most addresses (and name-address pairs) whose failures a process keeps at once."""


@dataclass
class SignInLimits:
    """The failed sign-ins of this process (and those under way), by client address and by
    (user name, address), each a window of their times (monotonic seconds)."""

    addresses: dict[str, deque[float]] = field(default_factory=dict)
    pairs: dict[str, deque[float]] = field(default_factory=dict)

    def refused(self, now: float, *, client: str, user: str) -> tuple[str, int] | None:
        """Why a sign-in from `client` as `user` ("" for a token) must wait, and how many
        seconds; None when it may go on."""
        if wait := _wait(self.addresses.get(client), FAILURES_PER_ADDRESS, now):
            return f"Too many failed sign-ins from your address: try again in {wait} s.", wait
        pair = self.pairs.get(_pair(user, client))
        if user and (wait := _wait(pair, FAILURES_PER_NAME_AND_ADDRESS, now)):
            return f"Too many failed sign-ins as {user}: try again in {wait} s.", wait
        return None

    def trying(self, now: float, *, client: str, user: str) -> None:
        """A sign-in begins: it counts as failed until it `succeeded` (so that many at once
        cannot all pass before the first has failed)."""
        _note(self.addresses, client, FAILURES_PER_ADDRESS, now)
        if user:
            _note(self.pairs, _pair(user, client), FAILURES_PER_NAME_AND_ADDRESS, now)

    def succeeded(self, now: float, *, client: str, user: str) -> None:
        """The sign-in begun at `now` succeeded: it counts no more."""
        for kept, key in ((self.addresses, client), (self.pairs, _pair(user, client))):
            if now in kept.get(key, ()):
                kept[key].remove(now)


def _pair(user: str, client: str) -> str:
    return f"{client} {user}"  # an address has no space


def _wait(times: deque[float] | None, limit: int, now: float) -> int:
    """Whole seconds until one more failure fits in the window (0: it does now)."""
    if times is None or len(times) < limit or now - times[0] >= SIGN_IN_WINDOW:
        return 0
    return max(1, int(times[0] + SIGN_IN_WINDOW - now + 0.999))


def _note(kept: dict[str, deque[float]], key: str, limit: int, now: float) -> None:
    if key not in kept and len(kept) >= KEYS_KEPT:  # forget those whose window is over
        for old in [k for k, t in kept.items() if now - t[-1] >= SIGN_IN_WINDOW]:
            del kept[old]
        if len(kept) >= KEYS_KEPT:
            kept.pop(next(iter(kept)))  # the longest kept
    kept.setdefault(key, deque(maxlen=limit)).append(now)


class Form(dict[str, str]):
    """A submitted form's fields, the first value of each."""


def address_of(request: Request) -> str:
    """The asking client's address: the peer's, or behind a trusted proxy the one it
    forwards (corral.proxies)."""
    peer = request.client.host if request.client else ""
    trusted = client_of(request).settings.api.networks
    if not trusted:
        return peer
    return proxies.client_address(peer, request.headers.getlist("x-forwarded-for"), trusted)


def client_of(request: Request) -> client.Client:
    c: client.Client = request.app.state.client
    return c


async def form_of(request: Request) -> Form:
    """The urlencoded body of a POST (htmx and plain forms both send it so)."""
    body = (await request.body()).decode("utf-8", "replace")
    return Form({k: v[0] for k, v in parse_qs(body, keep_blank_values=True).items()})


async def session(request: Request) -> access.WebSession:
    """The valid session of the request's cookie; NeedSignIn (a redirect) without one."""
    found = await client_of(request).session(request.cookies.get(COOKIE, ""))
    if found is None:
        back = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise errors.NeedSignIn(back)
    return found


async def acting(request: Request, who: Annotated[access.WebSession, Depends(session)]) -> Acting:
    """For a POST: the session, when the form carries its CSRF token and its role may act
    (operator or admin); Forbidden otherwise."""
    form = await form_of(request)
    check_csrf(request, who, form)
    if not who.role.allows(access.Role.OPERATOR):
        raise errors.Forbidden(f"a {who.role} may look but not act; it takes an operator")
    return Acting(who, form)


def check_csrf(request: Request, who: access.WebSession, form: Form) -> None:
    """Forbidden unless the request carries the session's CSRF token (htmx's header, or
    the form's `csrf` field)."""
    given = request.headers.get(CSRF_HEADER) or form.get("csrf", "")
    if not secrets.compare_digest(given.encode(), who.csrf.encode()):
        raise errors.Forbidden("the form's CSRF token is missing or wrong: reload the page")


class Acting:
    """A session allowed to act, and the form it sent."""

    def __init__(self, who: access.WebSession, form: Form) -> None:
        self.who = who
        self.form = form


def sees(who: access.WebSession, tenant: str) -> bool:
    return who.tenant is None or who.tenant == tenant


def set_cookie(request: Request, response: Response, name: str, value: str, age: int) -> None:
    response.set_cookie(
        name,
        value,
        max_age=age,
        path="/ui",
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
    )


def sign_in_url(back: str) -> str:
    return f"/ui/sign-in?next={quote(back, safe='')}"


Viewer = Annotated[access.WebSession, Depends(session)]
Operator = Annotated[Acting, Depends(acting)]
