"""What the browser tests share: a real `corral serve --demo --http` on a temporary SQLite
file (`site`, with ada, an operator of tenant default, and vera, its viewer), Debian's
Chromium driven by Playwright (`browser`), a page signed in as ada (`page`) and a maker of
other pages (`open_page`: a viewer's, a signed-out one, one with JavaScript disabled).
A module whose HTTP jobs must reach a server of its own makes `site` its
`receiving_site`: the same users, no demo jobs, and HTTP jobs allowed to reach `receiver`
(on 127.0.0.1, it keeps what it got).

Every page those two fixtures open is watched (checks.py): each page it visits must pass
axe-core with no serious or critical violation and keep the browser's console clean, or
the test fails at its end. `checks.checked(page)` checks the page as it is now (after an
htmx swap); `checks.expected_status(page, path, 404)` lets a test visit a page it means to
be refused."""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.acceptance.test_cli import serve_http, stopped
from tests.browser import checks
from tests.support.cli import run_corral
from tests.support.net import in_thread
from tests.support.wait import eventually_sync

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
"""Playwright's own browser download fails here, and the closed network refuses
Chromium's background connections: Debian's Chromium, with those turned off."""
DEADLINE_MS = 90_000
"""How long a step may take in the browser (generous: the suite also runs under load)."""
SCREENSHOT = Path(__file__).parents[2] / "docs" / "images" / "dashboard-overview.png"
"""The overview's screenshot in the docs, taken by test_dashboard.py: written when it is
missing or CORRAL_UPDATE_SCREENSHOTS=1, else to a temporary file (so a test run leaves the
checkout as it was)."""
PASSWORD = "correct horse battery"

playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")


@dataclass
class Site:
    base: str
    token: str  # an admin's, of every tenant
    root: Path  # corral's folder: the CLI there acts as the operator

    def submit(self, job: dict[str, Any]) -> int:
        """`job` submitted by the operator (`corral submit --from-file -`): its id."""
        made = run_corral(
            self.root, "submit", "--from-file", "-", "--json",
            stdin=json.dumps(job) + "\n", timeout=120, check=True,
        )  # fmt: skip
        job_id: int = json.loads(made.stdout)["jobs"][0]["id"]
        return job_id

    def api(self, method: str, path: str, **kw: Any) -> Any:
        sent = httpx.request(
            method,
            f"{self.base}/api/v1{path}",
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=60,
            **kw,
        )
        assert sent.status_code < 300, sent.text
        return sent.json()

    def wait_job(self, job_id: int, state: str) -> dict[str, Any]:
        found: dict[str, Any] = eventually_sync(
            lambda: (j := self.api("GET", f"/jobs/{job_id}"))["state"] == state and j,
            every=0.2,
            what=f"job {job_id} {state}",
        )
        return found


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    """`corral serve --demo --http` with users `ada` (operator of tenant default) and
    `vera` (its viewer), and an admin token to set the scene through the API."""
    yield from served(tmp_path_factory.mktemp("dashboard"), "--demo")


@dataclass
class Receiver:
    """An HTTP server on 127.0.0.1 that answers 200 ("ok") to every request and keeps each
    one's method, path and Authorization header."""

    url: str
    seen: list[tuple[str, str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def got(self, path: str) -> list[tuple[str, str, str]]:
        with self.lock:
            return [s for s in self.seen if s[1] == path]


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    kept: list[Receiver] = []

    class Handler(BaseHTTPRequestHandler):
        def answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with kept[0].lock:
                kept[0].seen.append(
                    (self.command, self.path, self.headers.get("Authorization") or "")
                )
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(b"ok")

        do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = answer

        def log_message(self, *args: Any) -> None:
            """Quiet: the test reads what was seen."""

    with in_thread(ThreadingHTTPServer(("127.0.0.1", 0), Handler)) as server:
        kept.append(Receiver(f"http://127.0.0.1:{server.server_address[1]}"))
        yield kept[0]


@pytest.fixture(scope="module")
def receiving_site(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[Site]:
    """`site` without the demo's jobs, whose HTTP jobs may reach the receiver's port on
    127.0.0.1 (its corral.toml allows it): a module takes it as its `site` (a fixture of
    that name returning it), so `page` and `open_page` are its pages."""
    root = tmp_path_factory.mktemp("receiving")
    port = receiver.url.rsplit(":", 1)[1]
    (root / "corral.toml").write_text(
        f'[executors.http]\nallow_networks = ["127.0.0.1:{port}"]\n', encoding="utf-8"
    )
    yield from served(root)


def served(root: Path, *args: str) -> Iterator[Site]:
    """`corral serve [ARGS] --http` in `root` (its database made), with ada and vera and an
    admin's token, until the module ends."""
    run_corral(root, "db", "upgrade", timeout=120, check=True)
    for user, role in (("ada", "operator"), ("vera", "viewer")):
        run_corral(root, "users", "add", user, "--tenant", "default", "--role", role,
                   "--password-stdin", stdin=PASSWORD + "\n", timeout=120, check=True)  # fmt: skip
    made = run_corral(
        root, "tokens", "create", "--all-tenants", "--role", "admin", timeout=120, check=True
    )
    server, base = serve_http(root, *args)
    try:
        yield Site(base, made.stdout.split()[-1], root)
    finally:
        stopped(server)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: `make test` installs Debian's chromium as root")
    if not checks.AXE.exists():
        why = f"{checks.AXE} is missing: `make test` installs it (npm ci in tests/browser)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(f"{why}; skipped locally, fails on CI")
    with playwright.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def open_page(browser: Any, site: Site) -> Iterator[Callable[..., Any]]:
    """Opens a page in a fresh browser context: `open_page()` signed in as ada,
    `open_page("vera")` as the viewer, `open_page(None)` signed out; Playwright's context
    options after it (`java_script_enabled=False`, ...). Every page it opens is watched
    (checks.py): each page visited must pass axe and keep the console clean, or the test
    fails at its end."""
    opened: list[Any] = []

    def open_(user: str | None = "ada", password: str = PASSWORD, **options: Any) -> Any:
        context = checks.watch(
            browser.new_context(
                base_url=site.base, **{"viewport": {"width": 1280, "height": 860}, **options}
            ),
            scripts_off=options.get("java_script_enabled") is False,
        )
        context.set_default_timeout(DEADLINE_MS)
        opened.append(context)
        made = context.new_page()
        if user is not None:
            signed_in(made, user, password)
        return made

    yield open_
    try:
        problems = [found for context in opened for found in checks.finished(context)]
    finally:
        for context in opened:
            context.close()
    checks.failed_on(problems)


def signed_in(page: Any, user: str, password: str = PASSWORD) -> Any:
    """`page` signed in as `user` through the sign-in form, on the jobs list."""
    page.goto("/ui/jobs")
    playwright.expect(page).to_have_url(re.compile(r"/ui/sign-in\?next="))
    page.fill("input[name=name]", user)
    page.fill("input[name=password]", password)
    page.click("button:has-text('Sign in')")
    playwright.expect(page).to_have_url(re.compile(r"/ui/jobs$"))
    playwright.expect(page.locator("header .who")).to_contain_text(f"{user} · ")
    return page


@pytest.fixture
def page(open_page: Callable[..., Any]) -> Any:
    """A fresh browser context, signed in as ada (operator of tenant default), its pages
    watched (checks.py)."""
    opened = open_page()
    playwright.expect(opened.locator("header .who")).to_have_text("ada · operator of default")
    return opened
