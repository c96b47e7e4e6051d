"""What the browser tests share: a real `corral serve --demo --http` on a temporary SQLite
file (`site`), Debian's Chromium driven by Playwright (`browser`), and a page signed in as
ada, an operator of tenant default (`page`).

The dashboard in real Chromium (Debian's, driven by Playwright) against a real `corral
serve --demo --http` on a temporary SQLite file: sign in, watch a job the operator
submitted finish without a reload (its page updated over server-sent events, not polled),
retry a quarantined job (one, and a queue's all from a preview, watching the operation
finish), pause a schedule, and be refused another tenant's job. The jobs that run
commands are the operator's (the CLI on the store): a tenant is not granted `process`, so
the jobs page offers it no command box. Deadlines are generous (the suite runs under load too) and
nothing sleeps for a fixed time: each step waits for what the page shows.

The overview's screenshot in the docs (docs/images/dashboard-overview.png) is taken here:
written when it is missing or CORRAL_UPDATE_SCREENSHOTS=1, else to a temporary file (so
a test run leaves the checkout as it was)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.acceptance.test_cli import serve_http, stopped
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
    """`corral serve --demo --http` with a user `ada` (operator of tenant default) and an
    admin token to set the scene through the API."""
    root = tmp_path_factory.mktemp("dashboard")
    run_corral(root, "db", "upgrade", timeout=120, check=True)
    run_corral(root, "users", "add", "ada", "--tenant", "default", "--role", "operator",
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
    with playwright.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any, site: Site) -> Iterator[Any]:
    """A fresh browser context, signed in as ada."""
    context = browser.new_context(base_url=site.base, viewport={"width": 1280, "height": 860})
    context.set_default_timeout(DEADLINE_MS)
    opened = context.new_page()
    opened.goto("/ui/jobs")
    playwright.expect(opened).to_have_url(re.compile(r"/ui/sign-in\?next="))
    opened.fill("input[name=name]", "ada")
    opened.fill("input[name=password]", PASSWORD)
    opened.click("button:has-text('Sign in')")
    playwright.expect(opened).to_have_url(re.compile(r"/ui/jobs$"))
    playwright.expect(opened.locator("header .who")).to_have_text("ada · operator of default")
    yield opened
    context.close()
