"""What every page the browser tests visit must pass: axe-core finds no serious or critical
violation on it, and the browser's console stays clean (no error logged, no uncaught
exception, no answer of 400 or more the test did not ask for).

`watch(context)` (the `page` and `open_page` fixtures call it) watches every page of a
browser context; `finished(context)` at the test's end gives what was found, each with
the page's path, and `failed_on` fails the test with it. `checked(page)` checks the page
as it is now (after an htmx swap) and fails at once. `expected_status(page, path, 404)`
lets a test visit a page it means to be refused: that answer, and the console lines
Chromium and htmx log for it, are not problems; the page itself is still checked.

How each page is checked:

- With JavaScript on, axe runs in the page itself once it has loaded: axe and a small
  runner are an init script, which the browser adds to each document through the DevTools
  protocol, so the dashboard's CSP stays in force for the page's own scripts (`script-src
  'self'` would refuse a script tag of axe's text; nothing of axe needs eval). The runner
  reports through an exposed binding. A navigation of the main frame (a link, a form,
  `goto`, htmx's redirect) waits in a route until the page it leaves has reported: the
  browser holds every DevTools message to a page while it navigates, so the test's side
  cannot run axe then, but the page's own scripts go on. A document is waited for from
  its answer on, not from its DOMContentLoaded: a test may see its heading (and leave it,
  or end) before the browser has said the document loaded.
- With JavaScript off, no timer fires, so axe cannot run in the page (nor with scripts
  turned back on through the protocol). Each document the page is sent (its body read
  as it arrives) is checked afterwards, at `checked` or at the end, in a twin: a page of
  a context of its own given the same answer, where the dashboard's scripts are answered
  empty and what <noscript> holds is shown, so it shows what the page showed.

axe-core is the npm package pinned in package.json beside this file (`make test` runs `npm
ci` here)."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

AXE = Path(__file__).parent / "node_modules" / "axe-core" / "axe.min.js"
FAILING = ["serious", "critical"]
"""The impacts that fail a test; axe's minor and moderate findings are not reported."""
WAIT_S = 60.0
"""How long a navigation waits for the check of the page it leaves (generous: under load)."""

RUN = """(() => {
  const failing = FAILING;
  const once = async () => {
    for (let tries = 1; ; tries++) {
      try {
        const found = await axe.run(document, {resultTypes: ["violations"]});
        return found.violations.filter((v) => failing.includes(v.impact)).map((v) =>
          `axe ${v.id} (${v.impact}: ${v.help}) at ${v.nodes.map((n) => n.target.join(" ")).join(", ")}`);
      } catch (error) {  // the page changed under it (a swap): again, then say so
        if (tries === 3) return [`axe could not run: ${error}`];
      }
    }
  };
  let last = Promise.resolve([]);
  window.corralAxe = () => (last = last.then(once, once));
  if (window !== window.top || !location.protocol.startsWith("http")) return;
  const path = location.pathname + location.search;
  window.addEventListener("load", () => setTimeout(async () => {
    window.corralChecked(path, await window.corralAxe());
  }, 0));
})();""".replace("FAILING", json.dumps(FAILING))
"""Defines `corralAxe()` (axe's findings that fail, one line each; one run at a time) and,
in a page's main frame, runs it once the page has loaded and reports to `corralChecked`."""


def _axe_source() -> str:
    if not AXE.exists():
        pytest.fail(
            f"{AXE} is missing: run `npm ci` in {AXE.parents[2]} (make test does; it needs "
            "node and npm, which `make system-packages` installs as root)"
        )
    return AXE.read_text()


@dataclass
class Document:
    """An answer a JavaScript-off page was given: checked later in a twin."""

    url: str
    status: int
    headers: dict[str, str]
    body: bytes


@dataclass
class Watch:
    """A page watched: what was found wrong on it, the answers its test expects, where
    its current document is (loading, loaded, reported) and, with JavaScript off, the
    documents it was sent that are not checked yet."""

    page: Any
    scripts_off: bool
    problems: list[str] = field(default_factory=list)
    expected: set[tuple[str, int]] = field(default_factory=set)
    state: str = "none"
    documents: list[Document] = field(default_factory=list)
    reading: int = 0  # the documents whose body is being read
    checked: list[str] = field(default_factory=list)  # the paths axe ran on, in order

    def expects(self, url: str, status: int) -> bool:
        return (_path(url), status) in self.expected

    def moved(self, state: str, *, frm: str | None) -> None:
        """The current document is now in `state` (if it was in `frm`, when given): a new
        document is loading, it has loaded, its check has reported."""
        if frm is None or self.state == frm:
            self.state = state


WATCHES: dict[Any, Watch] = {}
"""Every page watched, until its context is finished."""


def watch(context: Any, *, scripts_off: bool = False) -> Any:
    """`context`, watched: each page it opens is checked, every document of it, and its
    console errors are kept (`finished` gives them). `scripts_off`: the context was made
    with JavaScript disabled. All is set on the context before it has a page, so nothing
    a page does comes before its watch."""
    if not scripts_off:
        context.add_init_script(script=_axe_source() + "\n" + RUN)
        context.expose_binding("corralChecked", _reported)

    def of(page: Any) -> Watch:
        return WATCHES.get(page) or _watched(page, scripts_off)

    context.on("page", of)
    context.on("console", lambda message: message.page and _said(of(message.page), message))
    context.on("weberror", lambda error: error.page and _thrown(of(error.page), error.error))
    context.on("response", lambda response: _answered(of(response.frame.page), response))
    if not scripts_off:
        context.route(
            _may_navigate, lambda route, request: _leaving(of(request.frame.page), route, request)
        )
    return context


def _watched(page: Any, scripts_off: bool) -> Watch:
    """The watch of a new page of a watched context: where its current document is, from
    the page's own events."""
    seen = WATCHES[page] = Watch(page, scripts_off)
    if not scripts_off:
        page.on("domcontentloaded", lambda _: seen.moved("loading", frm=None))
        page.on("load", lambda _: seen.moved("loaded", frm="loading"))
    return seen


def _reported(source: dict[str, Any], path: str, problems: list[str]) -> None:
    """What the runner in a page found once it had loaded."""
    seen = WATCHES.get(source["page"])
    if seen is not None:
        seen.moved("reported", frm=None)
        seen.checked.append(path)
        seen.problems.extend(f"{path}: {problem}" for problem in problems)


def _said(seen: Watch, message: Any) -> None:
    if message.type != "error":
        return
    at = message.location.get("url", "") or seen.page.url
    if _answer_in(message.text, at) not in seen.expected:
        seen.problems.append(f"{_path(at)}: console error: {message.text}")


def _thrown(seen: Watch, error: Any) -> None:
    seen.problems.append(f"{_path(seen.page.url)}: uncaught {error}")


def _answered(seen: Watch, response: Any) -> None:
    if seen.scripts_off:
        _kept(seen, response)
    elif _document(response):
        seen.moved("loading", frm=None)  # it will be shown, and reported once loaded
    if response.status >= 400 and not seen.expects(response.url, response.status):
        seen.problems.append(f"{_path(response.url)}: answered {response.status}")


def _document(response: Any) -> bool:
    """`response` is a document the page's main frame will show (a navigation's answer,
    not a redirect)."""
    request = response.request
    main = request.is_navigation_request() and request.frame.parent_frame is None
    return main and not 300 <= response.status < 400


def _leaving(seen: Watch, route: Any, request: Any) -> None:
    """A request that may navigate: a navigation of the main frame first waits for the
    check of the page it leaves (the page's own scripts go on meanwhile)."""
    try:
        if request.is_navigation_request() and request.frame.parent_frame is None:
            _waited(seen)
    finally:
        route.fallback()


def _waited(seen: Watch) -> None:
    """Until the current document, if it is loading or loaded, has reported its check."""
    deadline = time.monotonic() + WAIT_S
    while seen.state in ("loading", "loaded") and not seen.page.is_closed():
        if time.monotonic() > deadline:
            seen.problems.append(f"{_path(seen.page.url)}: axe had not reported in {WAIT_S}s")
            seen.moved("reported", frm=None)
            return
        seen.page.wait_for_timeout(20)  # the driver's timer: the page's events go on


def _kept(seen: Watch, response: Any) -> None:
    """A JavaScript-off page's document, kept for its twin (not a redirect, which has
    nothing to show)."""
    kind = response.headers.get("content-type", "")
    if _document(response) and kind.startswith("text/html"):
        headers = {k: v for k, v in response.headers.items() if k != "set-cookie"}
        seen.reading += 1  # before the read yields: the twins wait for it
        try:
            body = response.body()
        except Exception as exc:
            seen.problems.append(f"{_path(response.url)}: not read for its check: {exc}")
            return
        finally:
            seen.reading -= 1
        seen.documents.append(Document(response.url, response.status, headers, body))


def expected_status(page: Any, path: str, status: int) -> None:
    """The test means `path` (its query too, if it has one) to answer `status` on
    `page` (a page, a form's answer, an htmx request): that answer, and the console lines
    Chromium and htmx log for it, are not problems."""
    WATCHES[page].expected.add((_path(path), status))


def checked(page: Any) -> Any:
    """`page` as it is now (after an htmx swap, say) passes axe, and its console has been
    clean so far: else the test fails here, saying what was found. Returns the page."""
    seen = WATCHES[page]
    if seen.scripts_off:
        found = _twins_checked(seen)
    else:
        _waited(seen)
        found = [f"{_path(page.url)}: {p}" for p in page.evaluate("window.corralAxe()")]
        seen.checked.append(_path(page.url))
    found, seen.problems = seen.problems + found, []
    failed_on(found)
    return page


def paths_checked(page: Any) -> list[str]:
    """The paths of the documents axe has run on in `page` so far, in order."""
    return list(WATCHES[page].checked)


def finished(context: Any) -> list[str]:
    """Every problem found on the pages of `context`, each page's last document checked
    first."""
    problems = []
    for page in [page for page in WATCHES if page.context == context]:
        seen = WATCHES[page]
        if seen.scripts_off:
            problems += seen.problems + _twins_checked(seen)
        else:
            _waited(seen)  # the page's report comes while it is still watched
            problems += seen.problems
        del WATCHES[page]
    return problems


def failed_on(problems: list[str]) -> None:
    """The test fails if anything was found wrong on the pages it visited."""
    if problems:
        shown = "\n  ".join(dict.fromkeys(problems))
        pytest.fail(f"the pages visited are not clean (tests/browser/checks.py):\n  {shown}")


def _twins_checked(seen: Watch) -> list[str]:
    """axe's findings on each document a JavaScript-off page was sent since its last check,
    each shown again in a twin page (scripts on, for axe) as it showed with JavaScript off:
    the dashboard's scripts answered empty, and what <noscript> holds shown."""
    deadline = time.monotonic() + WAIT_S
    while seen.reading and not seen.page.is_closed() and time.monotonic() < deadline:
        seen.page.wait_for_timeout(20)  # the driver's timer: the reads go on meanwhile
    documents, seen.documents = seen.documents, []
    if not documents:
        return []
    twins = seen.page.context.browser.new_context()
    try:
        twin, serving = twins.new_page(), {}
        twin.route("**/*", lambda route, request: _served(serving, route, request))
        found = []
        for document in documents:
            serving[document.url] = document
            twin.goto(document.url)
            twin.evaluate(_axe_source() + "\n" + RUN)
            found += [f"{_path(document.url)}: {p}" for p in twin.evaluate("corralAxe()")]
            seen.checked.append(_path(document.url))
        return found
    finally:
        twins.close()


def _served(serving: dict[str, Document], route: Any, request: Any) -> None:
    """The twin's answers: its document as the page was sent it, and no script."""
    document = serving.get(request.url)
    if request.resource_type == "script":
        route.fulfill(status=200, content_type="text/javascript", body="")
    elif document is not None and request.is_navigation_request():
        shown = NOSCRIPT.sub("", document.body.decode())
        route.fulfill(status=document.status, headers=document.headers, body=shown)
    else:
        route.fallback()


NOSCRIPT = re.compile(r"</?noscript\b[^>]*>", re.IGNORECASE)
"""The tags of <noscript>, taken out of a twin's page: what they hold shows, as it does
with JavaScript off."""


def _may_navigate(url: str) -> bool:
    """What the route looks at: not static files, nor event streams, which never
    navigate."""
    path = urlsplit(url).path
    return not path.startswith("/ui/static/") and not path.endswith("/stream")


def _path(url: str) -> str:
    """The path and query of `url`: what a problem names, and what a test expects."""
    parts = urlsplit(url)
    return parts.path + (f"?{parts.query}" if parts.query else "")


def _answer_in(text: str, at: str) -> tuple[str, int] | None:
    """The answer a console line tells of, as (path, status): Chromium's "Failed to load
    resource: the server responded with a status of 404 (Not Found)" (logged at the
    resource's URL, `at`), or htmx's "Response Status Error Code 422 from /ui/x"."""
    if found := re.search(r"responded with a status of (\d{3})", text):
        return _path(at), int(found[1])
    if found := re.search(r"Response Status Error Code (\d{3}) from (\S+)", text):
        return _path(found[2]), int(found[1])
    return None
