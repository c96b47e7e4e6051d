"""The cron in the browser, in real Chromium against a real `corral serve --http` whose HTTP
jobs may reach a receiver this test runs on 127.0.0.1 (conftest's `receiving_site`): an
HTTP schedule made through the form (the next firings previewed as it is typed), its first
firings on its page with their status and response time, its URL edited (the secret in it
kept), paused and resumed, run now, duplicated (a name taken first: refused beside its
field) and deleted; the same with JavaScript off (the Preview button in place of the live
preview); a viewer sees no action, and is refused one; the form's errors each beside its
field. Every page visited, and the preview after each swap, passes the checks of checks.py;
each refusal the test means is declared to them. Deadlines are generous and nothing
sleeps: each step waits for what the page shows, or what the receiver got.

The docs' screenshots of the form and of an HTTP cron's page (docs/images/schedule-form.png,
http-cron-page.png) are taken here: written when missing or CORRAL_UPDATE_SCREENSHOTS=1,
else to a temporary file."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.browser import checks
from tests.browser.conftest import Receiver, Site, playwright
from tests.support.cli import run_corral
from tests.support.wait import eventually_sync

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.xdist_group("browser-cron-forms"),
]

IMAGES = Path(__file__).parents[2] / "docs" / "images"
SECRET = "s3cret-in-the-url"


@pytest.fixture(scope="module")
def site(receiving_site: Site) -> Site:
    """conftest's site whose HTTP jobs may reach the receiver: `page` and `open_page` open
    its pages."""
    return receiving_site


def screenshot(page: Any, name: str, tmp_path: Path) -> None:
    """The page as the docs show it: kept when missing or asked for, else thrown away."""
    kept = IMAGES / name
    keep = not kept.exists() or os.environ.get("CORRAL_UPDATE_SCREENSHOTS") == "1"
    where = kept if keep else tmp_path / name
    page.screenshot(path=str(where), full_page=True)
    assert where.stat().st_size > 10_000


def fill_schedule(page: Any, name: str, url: str) -> None:
    page.fill("#f-name", name)
    page.select_option("#f-method", "GET")
    page.fill("#f-url", url)
    page.fill("#f-headers", f"Authorization: Bearer {SECRET}")
    page.check("input[name=when][value=every]")
    page.fill("#f-every", "1s")
    page.fill("#f-max_attempts", "2")


def wait_firings(page: Any, count: int = 1) -> None:
    """The schedule's page, reloaded until its history shows `count` firings whose jobs
    got 200, with their response times."""

    def shown() -> bool:
        page.reload()
        done = page.locator("#firings tr.firing", has_text="HTTP 200")
        return done.count() >= count

    eventually_sync(shown, every=0.5, what="a firing with HTTP 200 on the schedule's page")
    row = page.locator("#firings tr.firing", has_text="HTTP 200").first
    playwright.expect(row.locator("td").nth(3)).to_contain_text("succeeded")
    playwright.expect(row.locator("td").nth(4)).to_have_text(re.compile(r"^\d+\.\d{3} s$"))


def walk(page: Any, site: Site, receiver: Receiver, name: str, shots: Path | None = None) -> None:
    """An HTTP cron made, watched, edited, paused, resumed, run now, duplicated and
    deleted: the same steps whether JavaScript runs or not (`shots`: where the schedule
    page's screenshot goes when it is not kept)."""
    here = f"/ui/schedules/default/{name}"
    page.goto("/ui/schedules/new")
    fill_schedule(page, name, f"{receiver.url}/{name}?token={SECRET}")
    page.click("button:has-text('Make it')")
    playwright.expect(page).to_have_url(re.compile(rf"{here}\?note=schedule-made"))
    playwright.expect(page.locator(".note")).to_have_text(f"schedule {name} made")
    playwright.expect(page.locator("h1")).to_have_text(name)
    wait_firings(page, 3 if shots else 1)
    sent = eventually_sync(lambda: receiver.got(f"/{name}?token={SECRET}"), every=0.2,
                           what=f"a request to /{name} ({receiver.seen})")  # fmt: skip
    assert sent[0][2] == f"Bearer {SECRET}"
    assert SECRET not in page.content()
    if shots is not None:
        screenshot(page, "http-cron-page.png", shots)

    page.click("#actions #edit")
    playwright.expect(page.locator("#f-url")).to_have_value(
        f"{receiver.url}/{name}?token=[redacted]"
    )
    assert SECRET not in page.content()
    page.fill("#f-url", f"{receiver.url}/{name}-v2?token=[redacted]")
    page.click("button:has-text('Save')")
    playwright.expect(page.locator(".note")).to_have_text(f"schedule {name} saved")
    eventually_sync(lambda: receiver.got(f"/{name}-v2?token={SECRET}"), every=0.2,
                    what="a request to the edited URL, its secret kept")  # fmt: skip

    page.click("#actions button:has-text('Pause')")
    playwright.expect(page.locator(".note")).to_have_text(f"schedule {name} paused")
    assert site.api("GET", f"/schedules/{name}")["paused"] is True
    page.click("#actions button:has-text('Resume')")
    playwright.expect(page.locator(".note")).to_have_text(f"schedule {name} resumed")
    assert site.api("GET", f"/schedules/{name}")["paused"] is False

    page.click("#actions button:has-text('Run now')")
    note = page.locator(".note")
    playwright.expect(note).to_have_text(re.compile(rf"schedule {name} fired now: job \d+"))
    site.wait_job(int(note.inner_text().rsplit(" ", 1)[1]), "succeeded")

    duplicated(page, name)
    for gone in (f"{name}-copy", name):
        page.goto(f"/ui/schedules/default/{gone}")
        page.click("#actions button:has-text('Delete')")
        playwright.expect(page.locator("h1")).to_have_text(f"Delete schedule {gone}?")
        page.click(f"#delete-form button:has-text('Delete {gone}')")
        playwright.expect(page.locator(".note")).to_contain_text(f"schedule {gone} deleted")
        playwright.expect(page.locator(f"#schedule-default-{gone}")).to_have_count(0)


def duplicated(page: Any, name: str) -> None:
    """Schedule `name`, on its page, duplicated as NAME-copy: first as NAME itself, a name
    taken (409, the duplicate form drawn again with the error beside its field)."""
    checks.expected_status(page, f"/ui/schedules/default/{name}/duplicate", 409)
    page.fill("#actions #new-name", name)
    page.click("#actions button:has-text('Duplicate')")
    playwright.expect(page.locator("h1")).to_have_text(f"Duplicate schedule {name}")
    playwright.expect(page.locator("#f-new_name + #error-new_name")).to_contain_text("new_name:")
    page.fill("#f-new_name", f"{name}-copy")
    page.click("#duplicate-form button:has-text('Duplicate')")
    playwright.expect(page).to_have_url(re.compile(rf"/ui/schedules/default/{name}-copy\?"))
    playwright.expect(page.locator("h1")).to_have_text(f"{name}-copy")


def test_an_http_cron_is_made_watched_changed_and_deleted_in_the_browser(
    page: Any, site: Site, receiver: Receiver, tmp_path: Path
) -> None:
    """With JavaScript: the next firings appear as the rule is typed (htmx, debounced), each
    preview checked as it was swapped in."""
    page.goto("/ui/schedules/new")
    page.fill("#f-cron", "30 2 * * *")
    page.fill("#f-tz", "Europe/Paris")
    page.fill("#f-start", "2027-03-27")
    rows = page.locator("#preview #preview-firings tr.upcoming")
    playwright.expect(rows).to_have_count(5)
    playwright.expect(rows.nth(1)).to_contain_text("DST")
    playwright.expect(rows.nth(0)).to_contain_text("2027-03-27 02:30:00 CET")
    playwright.expect(rows.nth(0)).to_contain_text("2027-03-27 01:30:00 UTC")
    checks.checked(page)
    page.fill("#f-cron", "61 * * * *")
    playwright.expect(page.locator("#preview-error")).to_contain_text("cron: '61 * * * *'")
    checks.checked(page)
    page.fill("#f-name", "nightly-report")
    page.fill("#f-url", "https://hooks.example.com/report?token=...")
    page.fill("#f-headers", "Authorization: Bearer ...\nX-Team: data")
    page.fill("#f-cron", "*/15 9-17 * * 1-5")
    playwright.expect(rows).to_have_count(5)
    playwright.expect(rows.nth(0)).to_contain_text("09:00:00 CEST")
    checks.checked(page)
    screenshot(page, "schedule-form.png", tmp_path)
    walk(page, site, receiver, "ping", shots=tmp_path)


def test_the_same_without_javascript(
    open_page: Callable[..., Any], site: Site, receiver: Receiver
) -> None:
    """Every form is a plain POST: a refused field draws the form again (422), the Preview
    button draws it with the next firings (saving nothing), and Delete asks on a page of
    its own. Each page is checked as a browser without JavaScript shows it."""
    page = open_page(java_script_enabled=False)
    page.goto("/ui/schedules/new")
    fill_schedule(page, "plain", f"{receiver.url}/plain")
    page.fill("#f-every", "soon")
    checks.expected_status(page, "/ui/schedules", 422)
    page.click("button:has-text('Make it')")
    playwright.expect(page.locator("#f-every + #error-every")).to_contain_text("every:")
    page.fill("#f-every", "90m")
    page.click("button:has-text('Preview')")
    playwright.expect(page.locator("#preview-firings tr.upcoming")).to_have_count(5)
    playwright.expect(page.locator("#f-name")).to_have_value("plain")
    assert run_corral(site.root, "schedules", "show", "plain", timeout=120).returncode != 0
    checks.checked(page)
    walk(open_page(java_script_enabled=False), site, receiver, "plain")


FORGED = """([action, csrf]) => {
  const form = Object.assign(document.createElement("form"), {method: "post", action});
  form.append(Object.assign(document.createElement("input"), {name: "csrf", value: csrf}));
  document.body.append(form);
  form.submit();
}"""
"""A form the page does not offer, posted from it with the session's CSRF token."""


def test_a_viewer_sees_no_action(
    open_page: Callable[..., Any], site: Site, receiver: Receiver
) -> None:
    """No action on the schedule's page, no form to reach (403), and an action posted all
    the same is refused (403), on pages as clean as the others."""
    run_corral(site.root, "schedules", "add", "watched", "--every", "1h", "--http", "GET",
               f"{receiver.url}/watched", timeout=120, check=True)  # fmt: skip
    page = open_page("vera")
    page.goto("/ui/schedules/default/watched")
    playwright.expect(page.locator("h1")).to_have_text("watched")
    playwright.expect(page.locator("#actions")).to_have_count(0)
    playwright.expect(page.locator("form[method=post] button")).to_have_text(["Sign out"])
    for path, form in (("/ui/schedules/new", "#schedule-form"), ("/ui/jobs/new", "#job-form")):
        checks.expected_status(page, path, 403)
        assert page.goto(path).status == 403
        playwright.expect(page.locator("h1")).to_have_text("Refused")
        playwright.expect(page.locator(form)).to_have_count(0)
    page.goto("/ui/schedules/default/watched")
    csrf = page.locator("input[name=csrf]").first.get_attribute("value")
    pause = "/ui/schedules/default/watched/pause"
    checks.expected_status(page, pause, 403)
    page.evaluate(FORGED, [pause, csrf])
    playwright.expect(page.locator("h1")).to_have_text("Refused")
    assert site.api("GET", "/schedules/watched")["paused"] is False


def test_every_form_error_is_named_beside_its_field(page: Any, site: Site) -> None:
    """Each refusal draws the form again (422; 409 for a name taken) with the error beside
    its field, each page checked."""
    checks.expected_status(page, "/ui/schedules", 422)
    page.goto("/ui/schedules/new")
    fill_schedule(page, "broken", "http://127.0.0.1:9/x")
    page.fill("#f-headers", "no colon here")
    page.locator("details summary").click()
    page.fill("#f-labels", "no equals")
    page.fill("#f-payload", "{not json")
    page.fill("#f-max_attempts", "many")
    page.click("button:has-text('Make it')")
    for name, said in (
        ("headers", "headers: line 1, 'no colon here': write 'Name: value'"),
        ("labels", "labels: line 1, 'no equals': write key=value"),
        ("payload", "payload: not valid JSON"),
        ("max_attempts", "max_attempts: 'many' is not a whole number"),
    ):
        beside = page.locator(f"#f-{name} + #error-{name}")
        playwright.expect(beside).to_contain_text(said)
        playwright.expect(page.locator(f"#f-{name}")).to_have_attribute(
            "aria-describedby", re.compile(rf"\berror-{name}\b")
        )
    playwright.expect(page.locator("#form-errors li")).to_have_count(4)
    for name in ("headers", "labels", "payload", "max_attempts"):  # "More" is open: errors
        page.fill(f"#f-{name}", "")
    for name, value, said, fixed in (
        ("cron", "61 * * * *", "cron: '61 * * * *' is not a valid cron", "* * * * *"),
        ("url", "127.0.0.1/x", "url: must start with http:// or https://", "https://a.test/"),
        ("tz", "Mars/Olympus", "tz: 'Mars/Olympus' is not a known time zone", "UTC"),
    ):
        page.check("input[name=when][value=cron]")
        page.fill(f"#f-{name}", value)
        page.click("button:has-text('Make it')")
        playwright.expect(page.locator(f"#f-{name} + #error-{name}")).to_contain_text(said)
        page.fill(f"#f-{name}", fixed)
    site.api("POST", "/schedules", json={"name": "taken", "every": "1h", "executor": "http",
                                         "spec": {"method": "GET", "url": "https://a.test/"}})  # fmt: skip
    page.fill("#f-name", "taken")
    checks.expected_status(page, "/ui/schedules", 409)
    page.click("button:has-text('Make it')")
    playwright.expect(page.locator("#f-name + #error-name")).to_contain_text("name:")
    checks.expected_status(page, "/ui/jobs/http", 422)
    page.goto("/ui/jobs/new")
    page.fill("#f-url", "https://example.com/x")
    page.check("input[name=when][value=at]")
    page.fill("#f-run_at", "2020-01-01T09:00")
    page.click("button:has-text('Send')")
    playwright.expect(page.locator("#f-run_at + #error-run_at")).to_contain_text(
        "before now; send allow_past: true"
    )
