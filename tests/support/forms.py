"""The dashboard's forms of HTTP jobs and schedules over HTTP (no server): a client with
the `http` executor's checks and the no-op executor, sessions signed in with a token of
ada (an operator of tenant a), bea (of b), vic (a viewer of a) or root (an admin of every
tenant), and ways to read a page's form and post one."""

from __future__ import annotations

import html
import re
from typing import Any

import httpx

from corral import client, config, store
from corral.executors import registry
from corral.testing import FrozenClock
from tests.support.api import granting, sign_in
from tests.support.noop import NoopExecutor

WHO = {"ada": ("a", "operator"), "bea": ("b", "operator"), "vic": ("a", "viewer"),
       "root": (None, "admin")}  # fmt: skip
SETTINGS = config.Settings(pools={"nightly": 2})


async def forms_client(db: store.Store, settings: config.Settings = SETTINGS) -> client.Client:
    """A client that checks HTTP jobs as `corral serve` does (and runs none)."""
    clock = FrozenClock()
    granted = granting(settings, "noop")
    made = client.Client(
        store=db,
        executors={"noop": NoopExecutor()},
        checkers={"noop": NoopExecutor(), "http": registry.checker("http", granted, clock)},
        settings=granted,
        clock=clock,
    )
    return made


async def signed(http: httpx.AsyncClient, c: client.Client, name: str = "ada") -> str:
    """`http` signed in as `name` of WHO (with a token made for it): its CSRF token."""
    tenant, role = WHO[name]
    _, secret = await c.token_create(name=name, tenant=tenant, role=role)
    assert (await sign_in(http, token=secret)).status_code == 303
    return csrf(await http.get("/ui/jobs"))


def csrf(page: httpx.Response) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found is not None, page.text
    return found[1]


def values(page: httpx.Response, form_id: str) -> dict[str, str]:
    """What the form `form_id` of a page holds: its inputs' values (a radio's or a
    checkbox's when checked), its text areas' text and its selects' selected option."""
    found = re.search(rf'<form[^>]*id="{form_id}".*?</form>', page.text, re.S)
    assert found is not None, page.text
    form, held = found[0], {}
    for tag in re.finditer(r"<input\b[^>]*>", form):
        attrs = dict(re.findall(r'(\w[\w-]*)="([^"]*)"', tag[0]))
        if attrs.get("type") in ("radio", "checkbox") and " checked" not in tag[0]:
            continue
        if "name" in attrs:
            held[attrs["name"]] = html.unescape(attrs.get("value", ""))
    for area in re.finditer(r'<textarea[^>]*name="([^"]+)"[^>]*>\n?(.*?)</textarea>', form, re.S):
        held[area[1]] = html.unescape(area[2])
    for select in re.finditer(r'<select[^>]*name="([^"]+)"[^>]*>(.*?)</select>', form, re.S):
        chosen = re.search(r'<option value="([^"]*)" selected>', select[2])
        held[select[1]] = html.unescape(chosen[1]) if chosen else ""
    return held


def error_of(page: httpx.Response, field: str) -> str:
    """The error shown beside `field`: its element right after the input, which the input
    names in aria-describedby."""
    shown = re.search(rf'<p class="error" id="error-{field}">(.*?)</p>', page.text, re.S)
    assert shown is not None, f"no error beside {field}: {page.text}"
    tag = re.search(
        rf'<(input|textarea|select)\b[^>]*name="{field}"[^>]*>(?:.*?</\1>)?\s*'
        rf'<p class="error" id="error-{field}">',
        page.text,
        re.S,
    )
    assert tag is not None, f"the error is not right after the input of {field}"
    opening = tag[0].split(">", 1)[0]
    assert f"error-{field}" in opening, opening
    assert 'aria-invalid="true"' in opening, opening
    return html.unescape(shown[1])


async def post(http: httpx.AsyncClient, path: str, token: str, **fields: Any) -> httpx.Response:
    """A form posted with the session's CSRF token."""
    return await http.post(path, data={"csrf": token, **fields})
