"""Every example in README.md, CONTRIBUTING.md and docs/ parses, and the runnable ones run.

Each page is one session in a scratch folder of its own: `.venv` there is this
virtualenv, `examples/` and `deploy/` are the repository's, the database is migrated
first, no CORRAL_* variable of the test's environment leaks in, and the page's blocks run
in the order they appear, so an earlier block can submit the job a later one shows. The
markers are described in tests/support/doc_examples.py and in CONTRIBUTING.md.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest

from corral import config
from tests.support import doc_examples
from tests.support.cli import clean_env
from tests.support.doc_examples import Block
from tests.support.procs import kill_leftovers

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(
    [ROOT / name for name in ("README.md", "CONTRIBUTING.md", "CHANGELOG.md")]
    + list((ROOT / "docs").rglob("*.md")),
    key=lambda p: (p.parent != ROOT, str(p)),
)
SHARED = ("examples", "deploy")
"""Folders of the repository that examples read, linked into every scratch folder."""
BLOCK_SECONDS = 60.0
UNTIL_JOBS_END_SECONDS = 60.0
ENDED = ("succeeded", "failed", "quarantined", "cancelled")


def name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def test_the_pages_exist() -> None:
    assert (ROOT / "README.md") in PAGES
    assert len(PAGES) > 10, "docs/ has its pages"


def page_blocks(page: Path) -> list[Block]:
    """The page's blocks; a bad or misplaced marker fails the test that reads them."""
    try:
        return doc_examples.blocks(page, Path(name(page)))
    except doc_examples.MarkerError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_every_block_parses(page: Path) -> None:
    found = page_blocks(page)
    problems = [
        f"{block.where}: {block.language} block does not parse: {problem}"
        for block in found
        if (problem := doc_examples.parse_problem(block))
    ]
    assert not problems, "\n".join(problems)


@pytest.fixture(scope="module")
def venv() -> Path:
    prefix = Path(sys.prefix)
    if not (prefix / "bin" / "corral").exists():
        prefix = ROOT / ".venv"
    assert (prefix / "bin" / "corral").exists(), "run the tests from corral's virtualenv"
    return prefix


@pytest.fixture(scope="module")
def migrated(tmp_path_factory: pytest.TempPathFactory, venv: Path) -> Path:
    """A freshly migrated corral.db, copied into every page's scratch folder."""
    folder = tmp_path_factory.mktemp("template")
    subprocess.run(
        [venv / "bin" / "corral", "db", "upgrade"],
        cwd=folder,
        env=clean_env(),
        check=True,
        capture_output=True,
        timeout=BLOCK_SECONDS,
    )
    return folder / "corral.db"


class Session:
    """One page's scratch folder: `work/` is where its blocks run."""

    def __init__(self, root: Path, venv: Path, database: Path) -> None:
        self.work = root / "work"
        self.scripts = root / "blocks"
        self.work.mkdir()
        self.scripts.mkdir()
        (self.work / ".venv").symlink_to(venv)
        for shared in SHARED:
            (self.work / shared).symlink_to(ROOT / shared)
        shutil.copy(database, self.work / "corral.db")

    def run(self, block: Block) -> None:
        assert block.marker is None or block.marker.kind != "not run"
        if block.marker is not None and block.marker.kind == "file":
            self.write(block)
        elif block.language == "toml":
            self.check_settings(block)
        elif block.marker is not None and block.marker.kind == "until jobs end":
            self.run_until_jobs_end(block)
        else:
            expected = block.marker.code if block.marker else 0
            proc = self.start(block)
            try:
                output, _ = proc.communicate(timeout=BLOCK_SECONDS)
            except subprocess.TimeoutExpired:
                output = self.stop(proc)
                fail(block, f"still running after {BLOCK_SECONDS:g}s", output)
            if proc.returncode != expected:
                fail(block, f"exited {proc.returncode}, expected {expected}", output)

    def write(self, block: Block) -> None:
        assert block.marker is not None
        target = self.work / block.marker.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block.text, encoding="utf-8")
        if block.language == "toml":
            self.check_settings(block)

    def check_settings(self, block: Block) -> None:
        path = self.scripts / f"line-{block.line}.toml"
        path.write_text(block.text, encoding="utf-8")
        try:
            with mock.patch.dict(os.environ, clean_env(), clear=True):
                config.Settings.load(path)
        except Exception as exc:
            fail(block, "is not valid corral settings", str(exc))

    def start(self, block: Block) -> subprocess.Popen[str]:
        if block.language == "python":
            script = self.scripts / f"line-{block.line}.py"
            command = [str(self.work / ".venv" / "bin" / "python"), str(script)]
        else:
            script = self.scripts / f"line-{block.line}.sh"
            command = ["bash", "-e", "-o", "pipefail", str(script)]
        script.write_text(block.script(), encoding="utf-8")
        return subprocess.Popen(
            command,
            cwd=self.work,
            env=clean_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def run_until_jobs_end(self, block: Block) -> None:
        proc = self.start(block)
        deadline = time.monotonic() + UNTIL_JOBS_END_SECONDS
        while self.unfinished_jobs() and proc.poll() is None:
            if time.monotonic() > deadline:
                output = self.stop(proc)
                fail(block, f"jobs not ended after {UNTIL_JOBS_END_SECONDS:g}s", output)
            time.sleep(0.1)
        if proc.poll() is not None:
            output, _ = proc.communicate()
            if proc.returncode != 0:
                fail(block, f"exited {proc.returncode} before its jobs ended", output)
            return
        self.stop(proc)

    def unfinished_jobs(self) -> int:
        """The jobs not ended in every store of the scratch folder (corral.db, and a store
        of a page's own, e.g. the README's first-job.db)."""
        count = 0
        marks = ", ".join("?" * len(ENDED))
        query = f"SELECT count(*) FROM jobs WHERE state NOT IN ({marks})"
        for path in sorted(self.work.glob("*.db")):
            with contextlib.closing(sqlite3.connect(path, timeout=10)) as db:
                if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'jobs'").fetchone():
                    count += db.execute(query, ENDED).fetchone()[0]
        return count

    def stop(self, proc: subprocess.Popen[str]) -> str:
        """SIGTERM to the block's process group, SIGKILL if it lingers; its output."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            output, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
        deadline = time.monotonic() + 30
        while _group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        return output

    def close(self) -> None:
        """Let the page's jobs finish (they run detached), then kill what is left."""
        runs = self.work / ".corral" / "runs"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and runs.is_dir():
            folders = [r for r in runs.iterdir() if r.is_dir() and not r.name.startswith(".")]
            if all((run / "exit.json").exists() for run in folders):
                break
            time.sleep(0.1)
        kill_leftovers(runs)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fail(block: Block, what: str, output: str) -> None:
    pytest.fail(
        f"{block.where}: {block.language} block {what}\n--- block ---\n{block.text}"
        f"--- output ---\n{output}",
        pytrace=False,
    )


@pytest.fixture
def session(tmp_path: Path, venv: Path, migrated: Path) -> Iterator[Session]:
    s = Session(tmp_path, venv, migrated)
    yield s
    s.close()


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=name)
def test_the_examples_run(page: Path, session: Session) -> None:
    for block in page_blocks(page):
        if block.runs or (block.marker and block.marker.kind == "file"):
            session.run(block)


# --- the runner itself --------------------------------------------------------------------------


def block(language: str, text: str, marker: doc_examples.Marker | None = None) -> Block:
    return Block(Path("page.md"), 3, language, text, marker)


@pytest.mark.parametrize(
    ("example", "message"),
    [
        (block("shell", "echo oops\nfalse\n"), r"page.md:3: shell block exited 1, expected 0"),
        (block("python", "print('oops'); raise SystemExit(4)\n"), r"exited 4, expected 0"),
        (block("shell", "echo oops\n", doc_examples.Marker("exits", code=2)), r"expected 2"),
        (block("toml", "# oops\nclaim_batch_limits = 1\n"), r"not valid corral settings"),
    ],
)
def test_a_block_that_fails_names_its_file_line_and_output(
    session: Session, example: Block, message: str
) -> None:
    with pytest.raises(pytest.fail.Exception, match=rf"(?s){message}.*oops"):
        session.run(example)


def test_blocks_share_the_session_folder_and_see_no_corral_variables(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CORRAL_DATABASE_URL", "sqlite:////nonexistent/corral.db")
    session.run(
        block("toml", "[pools]\nnightly = 1\n", doc_examples.Marker("file", path="corral.toml"))
    )
    session.run(
        block(
            "shell",
            'test -z "${CORRAL_DATABASE_URL:-}"\n.venv/bin/corral submit --pool nightly -- true\n',
        )
    )
    session.run(block("shell", ".venv/bin/corral serve\n", doc_examples.Marker("until jobs end")))
    assert session.unfinished_jobs() == 0
    assert (session.work / ".corral" / "runs" / "corral-1-1" / "exit.json").exists()
