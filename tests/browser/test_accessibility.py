"""Every page of the dashboard, with real data behind it (a running job, a finished one,
quarantined ones, a schedule, a bulk operation, the error pages), passes axe-core with no
serious or critical violation and leaves the browser's console clean: for an operator, for
a viewer, signed out, and with JavaScript off. The check itself is checks.py, which every
browser test runs on each page it visits; here each page is visited on purpose, the test
makes sure axe ran on each, and that the check finds what it is for."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.browser import checks
from tests.browser.conftest import PASSWORD, Site, playwright
from tests.support.cli import run_corral

# One worker runs the module (pytest-xdist's loadgroup): its corral and browser start once;
# the other browser modules may run beside it on other workers.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.xdist_group("browser-accessibility"),
]

QUARANTINE_AT_3 = {
    "failure_rules": [{"on_exit_codes": {"operator": "In", "values": [3]}, "action": "fail"}]
}


@pytest.fixture(scope="module")
def scene(site: Site, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """What the pages show: a finished job, one running until the module ends, a
    quarantined one in queue `kept` and one in queue `bulk` (for a bulk discard), a
    schedule, and another tenant's job."""
    go = tmp_path_factory.mktemp("scene") / "go"
    wait = f"echo working; while [ ! -e {go} ]; do sleep 0.1; done"
    made = {
        "finished": site.submit({"spec": {"command": ["sh", "-c", "echo all done"]}}),
        "running": site.submit({"spec": {"command": ["sh", "-c", wait]}}),
        "theirs": site.submit({"spec": {"command": ["true"]}, "tenant": "other"}),
    }
    for queue in ("kept", "bulk"):
        made[queue] = site.submit({"spec": {"command": ["sh", "-c", "echo bad >&2; exit 3"]},
                                   "queue": queue, "policy": QUARANTINE_AT_3})  # fmt: skip
    run_corral(site.root, "schedules", "add", "nightly", "--cron", "0 2 * * *",
               "--tz", "Europe/Paris", "--", "sh", "-c", "echo nightly",
               timeout=120, check=True)  # fmt: skip
    site.wait_job(made["finished"], "succeeded")
    site.wait_job(made["running"], "running")
    for queue in ("kept", "bulk"):
        site.wait_job(made[queue], "quarantined")
    yield made
    go.touch()
    site.wait_job(made["running"], "succeeded")


def shown(page: Any, path: str, heading: str) -> str:
    """`path` visited, once its heading shows (axe runs on it as it loads): the path."""
    page.goto(path)
    playwright.expect(page.locator("h1")).to_have_text(heading)
    return path


def assert_checked(page: Any, paths: list[str]) -> None:
    """axe ran on each of `paths` (the check in checks.py did not pass by not running)."""
    checks.checked(page)
    ran = set(checks.paths_checked(page))
    assert [p for p in paths if p not in ran] == [], f"axe ran on {sorted(ran)}"


def test_every_page_an_operator_sees(page: Any, scene: dict[str, Any]) -> None:
    """Each page as it loads, the live parts as their streams leave them, a note after a
    form, and another tenant's job: not found, and its page as clean as the others."""
    visits = [
        shown(page, "/ui/", "Overview"),
        shown(page, "/ui/?fresh=1", "Overview"),
        shown(page, "/ui/jobs", "Jobs"),
        shown(page, "/ui/jobs?state=quarantined&queue=kept", "Jobs"),
        shown(page, "/ui/jobs?label=nonsense", "Jobs"),  # the filter's error, shown
        shown(page, f"/ui/jobs/{scene['finished']}", f"Job {scene['finished']}"),
        shown(page, f"/ui/jobs/{scene['kept']}", f"Job {scene['kept']}"),
        shown(page, f"/ui/jobs/{scene['running']}", f"Job {scene['running']}"),
    ]
    playwright.expect(page.locator(".running-output")).to_contain_text("working")
    checks.checked(page)  # as its stream shows it
    visits += [
        shown(page, "/ui/dead", "Quarantined jobs"),
        shown(page, "/ui/schedules", "Schedules"),
        shown(page, "/ui/bulk?action=discard&state=quarantined&queue=bulk", "Discard all…"),
    ]
    page.locator("#confirm button").click()
    playwright.expect(page.locator("#operation-state")).to_have_text("succeeded")
    checks.checked(page)  # as its stream left it
    visits += [re.sub(r"^https?://[^/]+", "", page.url)]
    visits += [shown(page, "/ui/operations", "Bulk operations")]
    visits += [shown(page, "/ui/alerts", "Alerts of tenant default")]
    page.fill("#f-channel", "oncall")
    page.fill("#f-webhook_url", "http://10.0.0.1/services/x")  # refused, beside its field
    checks.expected_status(page, "/ui/alerts/channels", 422)
    page.locator("#channel-form button").click()
    playwright.expect(page.locator("#error-webhook_url")).to_contain_text("refused")
    visits += ["/ui/alerts/channels"]
    visits += [shown(page, "/ui/monitors", "Monitors of tenant default")]
    visits += [shown(page, "/ui/flows", "Flows of tenant default")]
    page.fill("#f-flow", "stripe")
    page.fill("#f-rate", "fast")  # refused, beside its field
    checks.expected_status(page, "/ui/flows", 422)
    page.locator("#flow-form button").click()
    playwright.expect(page.locator("#error-rate")).to_contain_text("N/PERIOD")
    page.fill("#f-rate", "10/1s")
    page.locator("#flow-form button").click()
    playwright.expect(page.locator(".note")).to_contain_text("flow stripe made")
    visits += ["/ui/flows?note=flow-made&name=stripe"]
    visits += [shown(page, "/ui/flows/default/stripe", "Flow stripe")]
    checks.expected_status(page, f"/ui/jobs/{scene['theirs']}", 404)
    visits += [shown(page, f"/ui/jobs/{scene['theirs']}", "Not found")]
    assert_checked(page, visits)


def test_a_form_s_note_and_the_page_after_it(page: Any, scene: dict[str, Any]) -> None:
    shown(page, "/ui/schedules", "Schedules")
    row = page.locator("#schedule-default-nightly")
    row.locator("button").click()
    playwright.expect(page.locator(".note")).to_contain_text("schedule nightly")
    row.locator("button").click()  # back as it was
    playwright.expect(page.locator(".note")).to_contain_text("schedule nightly")
    assert_checked(page, ["/ui/schedules?note=schedule-changed&name=nightly&did=resumed"])


def test_every_page_a_viewer_sees(open_page: Callable[..., Any], scene: dict[str, Any]) -> None:
    """The same pages without their actions, and the page that refuses a viewer an action."""
    viewer = open_page("vera")
    visits = [
        shown(viewer, "/ui/", "Overview"),
        shown(viewer, "/ui/jobs", "Jobs"),
        shown(viewer, f"/ui/jobs/{scene['kept']}", f"Job {scene['kept']}"),
        shown(viewer, "/ui/dead", "Quarantined jobs"),
        shown(viewer, "/ui/schedules", "Schedules"),
        shown(viewer, "/ui/operations", "Bulk operations"),
        shown(viewer, "/ui/alerts", "Alerts of tenant default"),
    ]
    checks.expected_status(viewer, "/ui/bulk?action=retry&state=quarantined", 403)
    visits += [shown(viewer, "/ui/bulk?action=retry&state=quarantined", "Refused")]
    assert_checked(viewer, visits)


def test_signing_in_and_failing_to(open_page: Callable[..., Any]) -> None:
    """The form, its error (401, meant), and the page after it. The page names its icon,
    which is there: Chromium asks for no /favicon.ico (a 404 in the console, once)."""
    signed_out = open_page(None)
    shown(signed_out, "/ui/sign-in", "Sign in")
    icon = signed_out.request.get(signed_out.locator("link[rel=icon]").get_attribute("href"))
    assert (icon.status, icon.headers["content-type"]) == (200, "image/svg+xml")
    signed_out.fill("input[name=name]", "ada")
    signed_out.fill("input[name=password]", "not the password")
    checks.expected_status(signed_out, "/ui/sign-in", 401)
    signed_out.click("button:has-text('Sign in')")
    playwright.expect(signed_out.locator(".note")).to_contain_text("not valid")
    signed_out.fill("input[name=name]", "ada")
    signed_out.fill("input[name=password]", PASSWORD)
    signed_out.click("button:has-text('Sign in')")
    playwright.expect(signed_out.locator("h1")).to_have_text("Overview")
    assert_checked(signed_out, ["/ui/sign-in", "/ui/"])
    assert checks.paths_checked(signed_out).count("/ui/sign-in") >= 2  # the form, then its error


def test_every_page_with_javascript_off(
    open_page: Callable[..., Any], scene: dict[str, Any]
) -> None:
    """The pages as they are sent, forms included, checked as a browser without
    JavaScript shows them."""
    plain = open_page(java_script_enabled=False)
    visits = [
        shown(plain, "/ui/", "Overview"),
        shown(plain, f"/ui/jobs/{scene['running']}", f"Job {scene['running']}"),
        shown(plain, "/ui/dead", "Quarantined jobs"),
        shown(plain, "/ui/bulk?action=retry&state=quarantined&queue=kept", "Retry all…"),
        shown(plain, "/ui/alerts", "Alerts of tenant default"),
        shown(plain, "/ui/schedules", "Schedules"),
    ]
    plain.locator("#schedule-default-nightly button").click()
    playwright.expect(plain.locator(".note")).to_contain_text("schedule nightly")
    plain.locator("#schedule-default-nightly button").click()  # back as it was
    playwright.expect(plain.locator(".note")).to_contain_text("schedule nightly")
    assert_checked(plain, ["/ui/sign-in?next=%2Fui%2Fjobs", "/ui/jobs", *visits])


FAINT = """<!doctype html><html lang="en"><head><title>faint</title></head><body><main>
<h1>A page the check must refuse</h1>{}<img src="/ui/static/no-such.png" alt="">
</main></body></html>"""
"""Text a reader cannot make out (1.3:1 on white), and an image that is not there."""


@pytest.mark.parametrize("scripts", ["on", "off"])
def test_the_check_finds_faint_text_and_a_missing_file(
    open_page: Callable[..., Any], site: Site, scripts: str
) -> None:
    """With JavaScript off the faint text is inside <noscript>: shown then, and checked."""
    probe = open_page(None, java_script_enabled=scripts == "on")
    faint = '<p style="color: #e0e0e0">hard to read</p>'
    body = FAINT.format(faint if scripts == "on" else f"<noscript>{faint}</noscript>")
    probe.route(
        f"{site.base}/probe", lambda route: route.fulfill(content_type="text/html", body=body)
    )
    probe.goto("/probe")
    with pytest.raises(pytest.fail.Exception) as refused:
        checks.checked(probe)
    said = str(refused.value)
    assert "/probe: axe color-contrast (serious" in said
    assert "/ui/static/no-such.png: answered 404" in said
    assert "/ui/static/no-such.png: console error: Failed to load resource" in said


def test_an_answer_a_test_expects_is_told_by_chromium_s_line_and_htmx_s() -> None:
    chromium = "Failed to load resource: the server responded with a status of 404 (Not Found)"
    htmx = "Response Status Error Code 422 from /ui/schedules/preview"
    assert checks._answer_in(chromium, "http://127.0.0.1:1/ui/jobs/9?x=1") == (
        "/ui/jobs/9?x=1",
        404,
    )
    assert checks._answer_in(htmx, "http://127.0.0.1:1/ui/static/htmx.min.js") == (
        "/ui/schedules/preview",
        422,
    )
    assert checks._answer_in("Uncaught TypeError: x is undefined", "http://127.0.0.1:1/") is None
