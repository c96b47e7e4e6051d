"""What the browser tests share: a real `corral serve --demo --http` on a temporary SQLite
file (`site`, with ada, an operator of tenant default, and vera, its viewer), Debian's
Chromium driven by Playwright (`browser`), a page signed in as ada (`page`) and a maker of
other pages (`open_page`: a viewer's, a signed-out one, one with JavaScript disabled).

Every page those two fixtures open is watched (checks.py): each page it visits must pass
axe-core with no serious or critical violation and keep the browser's console clean, or
the test fails at its end. `checks.checked(page)` checks the page as it is now (after an
htmx swap); `checks.expected_status(page, path, 404)` lets a test visit a page it means to
be refused."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.acceptance.test_cli import serve_http, stopped
from tests.browser import checks
from tests.support.cli import run_corral
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
    root = tmp_path_factory.mktemp("dashboard")
    run_corral(root, "db", "upgrade", timeout=120, check=True)
    for user, role in (("ada", "operator"), ("vera", "viewer")):
        run_corral(root, "users", "add", user, "--tenant", "default", "--role", role,
                   "--password-stdin", stdin=PASSWORD + "\n", timeout=120, check=True)  # fmt: skip
    made = run_corral(
        root, "tokens", "create", "--all-tenants", "--role", "admin", timeout=120, check=True
    )
    token = made.stdout.split()[-1]
    server, base = serve_http(root, "--demo")
    try:
        yield Site(base, token, root)
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
