"""Who is looking at the dashboard: the session of their cookie, the role it acts in, and
the CSRF token every form they send must carry.

The cookie holds a random secret (the store keeps its SHA-256): HttpOnly, SameSite=Lax,
and Secure when the page came over https. A POST without the session's CSRF token (a
form's `csrf` field, or htmx's `X-CSRF-Token` header) is refused with 403. The sign-in
form, sent before there is a session, carries the double of a cookie of its own instead.
"""

from __future__ import annotations

import secrets
from typing import Annotated
from urllib.parse import parse_qs, quote

from fastapi import Depends, Request
from starlette.responses import Response

from corral import client, model

COOKIE = "corral_session"
SIGN_IN_COOKIE = "corral_sign_in"
CSRF_HEADER = "x-csrf-token"


class NeedSignIn(Exception):
    """Raised when a page is asked for without a valid session: to the sign-in page."""

    def __init__(self, back: str) -> None:
        super().__init__(back)
        self.back = back


class Forbidden(Exception):
    """Raised when the session's role may not do what was asked, or a form came without
    the session's CSRF token: 403."""


class Form(dict[str, str]):
    """A submitted form's fields, the first value of each."""


def client_of(request: Request) -> client.Client:
    c: client.Client = request.app.state.client
    return c


async def form_of(request: Request) -> Form:
    """The urlencoded body of a POST (htmx and plain forms both send it so)."""
    body = (await request.body()).decode("utf-8", "replace")
    return Form({k: v[0] for k, v in parse_qs(body, keep_blank_values=True).items()})


async def session(request: Request) -> model.WebSession:
    """The valid session of the request's cookie; NeedSignIn (a redirect) without one."""
    found = await client_of(request).session(request.cookies.get(COOKIE, ""))
    if found is None:
        back = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise NeedSignIn(back)
    return found


async def acting(request: Request, who: Annotated[model.WebSession, Depends(session)]) -> Acting:
    """For a POST: the session, when the form carries its CSRF token and its role may act
    (operator or admin); Forbidden otherwise."""
    form = await form_of(request)
    check_csrf(request, who, form)
    if not who.role.allows(model.Role.OPERATOR):
        raise Forbidden(f"a {who.role} may look but not act; it takes an operator")
    return Acting(who, form)


def check_csrf(request: Request, who: model.WebSession, form: Form) -> None:
    """Forbidden unless the request carries the session's CSRF token (htmx's header, or
    the form's `csrf` field)."""
    given = request.headers.get(CSRF_HEADER) or form.get("csrf", "")
    if not secrets.compare_digest(given.encode(), who.csrf.encode()):
        raise Forbidden("the form's CSRF token is missing or wrong: reload the page")


class Acting:
    """A session allowed to act, and the form it sent."""

    def __init__(self, who: model.WebSession, form: Form) -> None:
        self.who = who
        self.form = form


def sees(who: model.WebSession, tenant: str) -> bool:
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


Viewer = Annotated[model.WebSession, Depends(session)]
Operator = Annotated[Acting, Depends(acting)]
