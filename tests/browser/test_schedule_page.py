"""A schedule's page in real Chromium against a real `corral serve --http` (conftest's
`receiving_site`: its HTTP jobs may reach a receiver on 127.0.0.1): an HTTP schedule made
through the API fires against the receiver, and its page shows its request (secrets
redacted), its next firings to the second in its zone and UTC, its firings with HTTP status
and response time, its success rate and two charts; Pause comes back to the page; 120
firings page by keyset through #older; a viewer sees no action; another tenant's schedule
is not found; no page breaks the content security policy. Every page visited passes the
checks of checks.py.

The schedule page's screenshot in the docs (docs/images/schedule-page.png) is taken here:
written when it is missing or CORRAL_UPDATE_SCREENSHOTS=1, else to a temporary file."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.browser import checks
from tests.browser.conftest import Receiver, Site, playwright
from tests.support.wait import eventually_sync

# One worker runs the module (pytest-xdist's loadgroup): its corral and browser start once;
# the other browser modules may run beside it on other workers.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.xdist_group("browser-schedule-page"),
]

SCREENSHOT = Path(__file__).parents[2] / "docs" / "images" / "schedule-page.png"


@pytest.fixture(scope="module")
def site(receiving_site: Site) -> Site:
    """conftest's site whose HTTP jobs may reach the receiver: `page` and `open_page` open
    its pages."""
    return receiving_site


def http_schedule(site: Site, receiver: Receiver, name: str, **more: Any) -> dict[str, Any]:
    body = {
        "name": name,
        "executor": "http",
        "spec": {
            "method": "POST",
            "url": f"{receiver.url}/hook?token=s3cret&page=2",
            "headers": {"Authorization": "Bearer s3cret"},
            "json": {"hello": "corral"},
        },
        **more,
    }
    made: dict[str, Any] = site.api("POST", "/schedules", json=body)
    return made


def test_an_http_schedule_s_page_shows_its_request_firings_and_stats(
    page: Any, site: Site, receiver: Receiver, tmp_path: Path
) -> None:
    http_schedule(site, receiver, "ping", every="2s", tz="Europe/Paris")

    def succeeded() -> list[Any]:
        rows = site.api("GET", "/schedules/ping/firings")["firings"]
        return [r for r in rows if r["job_state"] == "succeeded"][2:]

    eventually_sync(succeeded, every=0.3, what="3 firings of ping succeeded")
    page.goto("/ui/schedules")
    page.locator("#schedule-default-ping a", has_text="ping").click()
    playwright.expect(page).to_have_url(re.compile(r"/ui/schedules/default/ping$"))
    playwright.expect(page.locator("h1")).to_have_text("ping")
    settings = page.locator("#settings")
    playwright.expect(settings).to_contain_text("POST")
    playwright.expect(settings).to_contain_text(f"{receiver.url}/hook?token=[redacted]&page=2")
    playwright.expect(settings).to_contain_text("Authorization: [redacted]")
    assert "s3cret" not in page.content()
    times = page.locator("#upcoming tr.nominal td:nth-child(2)").all_inner_texts()
    assert len(times) == 10
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", t) for t in times), times
    assert len(set(times)) == 10, "a 2 s schedule's next times, told apart to the second"
    local = page.locator("#upcoming tr.nominal td:nth-child(1)").first.inner_text()
    assert local.endswith(("CET", "CEST"))
    first = page.locator("#firings tr.firing").filter(has_text="succeeded").first
    playwright.expect(first).to_contain_text("HTTP 200")
    playwright.expect(first.locator("td").nth(4)).to_contain_text(" s")
    playwright.expect(page.locator("#stats")).to_contain_text("%")
    for key in ("24h", "30d"):
        chart = page.locator(f"#chart-{key} svg")
        playwright.expect(chart).to_be_visible()
        assert chart.get_attribute("role") == "img"
        assert page.locator(f"#chart-{key}-title").count() == 1
    keep = not SCREENSHOT.exists() or os.environ.get("CORRAL_UPDATE_SCREENSHOTS") == "1"
    where = SCREENSHOT if keep else tmp_path / SCREENSHOT.name
    page.screenshot(path=str(where), full_page=True)
    page.locator("#actions button", has_text="Pause").click()
    playwright.expect(page.locator(".note")).to_have_text("schedule ping paused")
    playwright.expect(page).to_have_url(re.compile(r"/ui/schedules/default/ping\?note="))
    playwright.expect(page.locator("#actions #resume")).to_have_text("Resume")
    assert site.api("GET", "/schedules/ping")["paused"] is True


def test_120_firings_page_by_keyset(page: Any, site: Site, receiver: Receiver) -> None:
    """120 backfilled a day ago, and whatever fired between its making and its pause: every
    one shown once, a page of 50 after another, the latest first."""
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(days=1)
    http_schedule(site, receiver, "dense", every="1s", start=start.isoformat())
    site.api("POST", "/schedules/dense/pause")
    window = {"from": start.isoformat(), "to": (start + timedelta(seconds=120)).isoformat()}
    assert site.api("POST", "/schedules/dense/backfill", json=window)["created"] == 120
    stored = site.api("GET", "/schedules/dense/firings?limit=1000")["firings"]
    assert len(stored) >= 120
    wanted = [
        datetime.fromisoformat(f["nominal_at"]).strftime("%Y-%m-%d %H:%M:%S UTC") for f in stored
    ]
    page.goto("/ui/schedules/default/dense")
    seen: list[str] = []
    while True:
        rows = page.locator("#firings tr.firing")
        playwright.expect(rows).to_have_count(min(50, len(wanted) - len(seen)))
        shown = rows.locator("td:first-child").all_inner_texts()
        assert not seen or shown[0] < seen[-1], "no firing twice, none skipped at the seam"
        seen += shown
        if page.locator("#older").count() == 0:
            break
        page.locator("#older").click()
    assert seen == wanted
    assert len(seen) // 50 >= 2  # three pages at least


def test_a_viewer_sees_no_action_and_another_tenant_s_schedule_is_not_found(
    open_page: Callable[..., Any], site: Site, receiver: Receiver
) -> None:
    http_schedule(site, receiver, "quiet", cron="0 3 * * *")
    http_schedule(site, receiver, "theirs", cron="0 3 * * *", tenant="other")
    viewer = open_page("vera")
    playwright.expect(viewer.locator("header .who")).to_have_text("vera · viewer of default")
    viewer.goto("/ui/schedules")
    playwright.expect(viewer.locator("#schedules")).to_contain_text("quiet")
    assert viewer.locator("#new-schedule").count() == 0
    assert viewer.locator("#schedules button").count() == 0
    viewer.goto("/ui/schedules/default/quiet")
    playwright.expect(viewer.locator("h1")).to_have_text("quiet")
    playwright.expect(viewer.locator("#settings")).to_contain_text("0 3 * * *")
    assert viewer.locator("#actions").count() == 0
    checks.expected_status(viewer, "/ui/schedules/other/theirs", 404)
    answer = viewer.goto("/ui/schedules/other/theirs")
    assert answer.status == 404
    playwright.expect(viewer.locator("h1")).to_have_text("Not found")
    viewer.goto("/ui/schedules")
    playwright.expect(viewer.locator("#schedules")).not_to_contain_text("theirs")


CSP_WATCH = """
window.__violations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__violations.push(`${e.violatedDirective} ${e.blockedURI} ${e.sourceFile}:${e.lineNumber}`);
});
"""


def test_the_schedule_pages_keep_the_content_security_policy(
    page: Any, site: Site, receiver: Receiver
) -> None:
    """Inline SVG with patterns, titles and a line, and the list: no inline style or script."""
    http_schedule(site, receiver, "csp", every="1h")
    page.context.add_init_script(CSP_WATCH)
    for path in ("/ui/schedules", "/ui/schedules/default/csp", "/ui/schedules/default/csp?before=2026-01-01T00:00:00Z"):  # fmt: skip
        answer = page.goto(path)
        assert answer is not None
        assert answer.status == 200
        page.wait_for_load_state("networkidle")
        assert page.evaluate("window.__violations") == [], path
