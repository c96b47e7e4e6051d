"""The dashboard in real Chromium (Debian's, driven by Playwright) against a real `corral
serve --demo --http` on a temporary SQLite file (conftest.py): sign in, watch a job the
operator submitted finish without a reload (its page updated over server-sent events, not
polled), retry a quarantined job (one, and a queue's all from a preview, watching the
operation finish), pause a schedule, and be refused another tenant's job. The jobs that run
commands are the operator's (the CLI on the store): a tenant is not granted `process`, so
the jobs page offers it no command box. Deadlines are generous (the suite runs under load
too) and nothing sleeps for a fixed time: each step waits for what the page shows.

The overview's screenshot in the docs (docs/images/dashboard-overview.png) is taken here:
written when it is missing or CORRAL_UPDATE_SCREENSHOTS=1, else to a temporary file (so
a test run leaves the checkout as it was)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from tests.browser import checks
from tests.browser.conftest import DEADLINE_MS, SCREENSHOT, Site, playwright
from tests.support.cli import run_corral
from tests.support.wait import eventually_sync

# One worker runs the module (pytest-xdist's loadgroup): its corral and browser start once;
# the other browser modules may run beside it on other workers.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.xdist_group("browser-dashboard"),
]


def test_a_job_finishes_live_on_its_page_and_no_command_box_is_offered(
    page: Any, site: Site
) -> None:
    """The page is updated over its event stream: the browser asks for nothing else."""
    playwright.expect(page.locator("h1")).to_be_visible()
    assert page.locator("#submit").count() == 0, "tenant default is not granted process"
    asked: list[tuple[str, str]] = []
    page.on("request", lambda r: asked.append((r.resource_type, r.url)))
    job = site.submit({"spec": {"command": ["sh", "-c", "echo hello from the browser; sleep 1"]}})
    page.goto(f"/ui/jobs/{job}")
    page.evaluate("window.notReloaded = true")  # gone if the page were loaded again
    playwright.expect(page.locator("#job-state")).to_have_text("succeeded", timeout=DEADLINE_MS)
    assert page.evaluate("window.notReloaded === true")
    of_job = [
        (kind, url.split("/ui/jobs/", 1)[1]) for kind, url in asked if f"/ui/jobs/{job}" in url
    ]
    assert of_job[0] == ("document", str(job))
    assert ("eventsource", f"{job}/stream") in of_job
    assert {kind for kind, _ in of_job[1:]} == {"eventsource"}, of_job  # no polling
    attempt = page.locator("#attempts li").first
    playwright.expect(attempt).to_contain_text("exit code 0")
    playwright.expect(attempt).to_contain_text("executor process")
    playwright.expect(attempt.locator("pre")).to_contain_text("hello from the browser")
    playwright.expect(page.locator("#events")).to_contain_text("succeeded")


def test_a_running_job_s_output_shows_as_it_is_written(
    page: Any, site: Site, tmp_path: Path
) -> None:
    """The job waits for a file the test makes once the page has shown its first line."""
    go = tmp_path / "go"
    script = f"echo first line; while [ ! -e {go} ]; do sleep 0.1; done; echo last line"
    page.goto(f"/ui/jobs/{site.submit({'spec': {'command': ['sh', '-c', script]}})}")
    playwright.expect(page.locator(".running-output")).to_contain_text("first line")
    playwright.expect(page.locator("#job-state")).to_have_text("running")
    go.touch()
    playwright.expect(page.locator("#job-state")).to_have_text("succeeded")
    playwright.expect(page.locator("#attempts pre")).to_contain_text("last line")


def test_a_quarantined_job_is_retried_from_the_quarantined_page(page: Any, site: Site) -> None:
    job_id = site.submit(
        {
            "spec": {"command": ["sh", "-c", "echo broken input >&2; exit 3"]},
            "queue": "browser",
            "policy": {
                "failure_rules": [
                    {"on_exit_codes": {"operator": "In", "values": [3]}, "action": "fail"}
                ]
            },
        },
    )
    site.wait_job(job_id, "quarantined")
    page.goto("/ui/dead")
    row = page.locator("#dead tr", has=page.locator(f"a[href='/ui/jobs/{job_id}']"))
    row.locator("button:has-text('Retry')").click()
    playwright.expect(page.locator(".note")).to_have_text(f"job {job_id} sent back to its queue")
    eventually_sync(
        lambda: site.api("GET", f"/jobs/{job_id}")["attempts"] >= 2,
        what="a second attempt after the retry",
    )


def test_quarantined_jobs_are_retried_from_a_preview(page: Any, site: Site, tmp_path: Path) -> None:
    """Two jobs fail until a file exists; once quarantined, the file is made and "Retry
    all…" on the jobs list (filtered to their queue) sends both back: they then succeed."""
    fixed = tmp_path / "fixed"
    job = {
        "spec": {"command": ["sh", "-c", f"[ -e {fixed} ] || exit 3"]},
        "queue": "bulk-browser",
        "policy": {
            "failure_rules": [
                {"on_exit_codes": {"operator": "In", "values": [3]}, "action": "fail"}
            ]
        },
    }
    ids = [site.submit({**job, "idempotency_key": f"bulk-{n}"}) for n in range(2)]
    for job_id in ids:
        site.wait_job(job_id, "quarantined")
    fixed.touch()
    page.goto("/ui/jobs?state=quarantined&queue=bulk-browser")
    page.locator("#bulk a:has-text('Retry all')").click()
    playwright.expect(page.locator("#preview-count")).to_have_text("2")
    for job_id in ids:
        playwright.expect(page.locator("#preview-sample")).to_contain_text(str(job_id))
    page.locator("#confirm button").click()
    playwright.expect(page).to_have_url(re.compile(r"/ui/operations/\d+$"))
    page.evaluate("window.notReloaded = true")
    playwright.expect(page.locator("#operation-state")).to_have_text("succeeded")
    playwright.expect(page.locator("#op-applied")).to_have_text("2")
    assert page.evaluate("window.notReloaded === true")
    for job_id in ids:
        assert site.wait_job(job_id, "succeeded")["attempts"] >= 2


def test_a_schedule_is_paused_on_the_schedules_page(page: Any, site: Site) -> None:
    run_corral(site.root, "schedules", "add", "browser-nightly", "--cron", "0 2 * * *",
               "--tz", "Europe/Paris", "--", "sh", "-c", "echo nightly",
               timeout=120, check=True)  # fmt: skip
    page.goto("/ui/schedules")
    row = page.locator("#schedule-default-browser-nightly")
    playwright.expect(row).to_contain_text("0 2 * * *")
    playwright.expect(row.locator("td").nth(3)).to_contain_text(":00")  # next firings
    row.locator("button:has-text('Pause')").click()
    playwright.expect(page.locator(".note")).to_have_text("schedule browser-nightly paused")
    playwright.expect(row.locator("button")).to_have_text("Resume")
    assert site.api("GET", "/schedules/browser-nightly")["paused"] is True


def test_another_tenant_s_job_is_refused(page: Any, site: Site) -> None:
    theirs = site.submit({"spec": {"command": ["true"]}, "tenant": "other"})
    checks.expected_status(page, f"/ui/jobs/{theirs}", 404)
    answer = page.goto(f"/ui/jobs/{theirs}")
    assert answer.status == 404
    playwright.expect(page.locator("h1")).to_have_text("Not found")
    page.goto("/ui/jobs")
    playwright.expect(page.locator("#jobs")).not_to_contain_text("other")


def test_the_overview_shows_counts_and_quarantined_jobs(
    page: Any, site: Site, tmp_path: Path
) -> None:
    """Late, so the overview has more to show: its screenshot is the docs'. Its own
    quarantined job, so what earlier tests retried may be running again meanwhile."""
    broken = site.submit(
        {
            "spec": {"command": ["sh", "-c", "echo no such table >&2; exit 3"]},
            "queue": "overview",
            "policy": {
                "failure_rules": [
                    {"on_exit_codes": {"operator": "In", "values": [3]}, "action": "fail"}
                ]
            },
        },
    )
    site.wait_job(broken, "quarantined")
    succeeded = page.locator("#counts .card", has_text="succeeded").locator(".n")
    listed = page.locator(f"#quarantined a[href='/ui/jobs/{broken}']")

    def both_shown() -> bool:
        page.goto("/ui/?fresh=1")
        return succeeded.inner_text() != "0" and listed.count() == 1

    eventually_sync(both_shown, every=0.5, what="succeeded and quarantined jobs on the overview")
    keep = not SCREENSHOT.exists() or os.environ.get("CORRAL_UPDATE_SCREENSHOTS") == "1"
    where = SCREENSHOT if keep else tmp_path / SCREENSHOT.name
    page.screenshot(path=str(where), full_page=True)
    assert where.stat().st_size > 10_000


CSP_WATCH = """
window.__violations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__violations.push(`${e.violatedDirective} ${e.blockedURI} ${e.sourceFile}:${e.lineNumber}`);
});
"""


def test_no_page_breaks_the_content_security_policy(page: Any, site: Site) -> None:
    """Every page, with htmx working on it (a live job page, the overview's charts, a
    quarantined job's actions), loads and runs under the dashboard's CSP: no inline script
    or style, nothing from elsewhere. A violation reported on any page fails."""
    page.context.add_init_script(CSP_WATCH)
    said: list[str] = []
    page.on(
        "console", lambda m: said.append(m.text) if "Content Security Policy" in m.text else None
    )
    job_id = site.submit({"spec": {"command": ["sh", "-c", "sleep 1"]}, "queue": "csp"})
    pages = ["/ui/", "/ui/jobs", f"/ui/jobs/{job_id}", "/ui/dead", "/ui/schedules",
             "/ui/operations", "/ui/jobs?note=job-changed&job=1&did=cancelled"]  # fmt: skip
    for path in pages:
        answer = page.goto(path)
        assert answer is not None
        headers = answer.headers
        assert "frame-ancestors 'none'" in headers["content-security-policy"]
        assert headers["x-frame-options"] == "DENY"
        page.wait_for_load_state("networkidle")
        playwright.expect(page.locator("h1")).to_be_visible()
        assert page.evaluate("window.__violations") == [], path
    playwright.expect(page.locator(".note")).to_have_text("job 1 cancelled")
    page.goto("/ui/jobs?note=Your+session+expired.+Call+555-0100")
    assert page.locator(".note").count() == 0, "a note outside the fixed set is not shown"
    site.wait_job(job_id, "succeeded")
    assert said == []
