"""How the docs' example blocks are found and marked (tests/support/doc_examples.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import doc_examples
from tests.support.doc_examples import Marker, MarkerError


def page(tmp_path: Path, text: str) -> list[doc_examples.Block]:
    path = tmp_path / "page.md"
    path.write_text(text, encoding="utf-8")
    return doc_examples.blocks(path, Path("page.md"))


def test_blocks_in_order_with_their_lines_languages_and_markers(tmp_path: Path) -> None:
    found = page(
        tmp_path,
        "# A page\n\n```sh\necho one\n```\n\n<!-- not run: needs a Kubernetes cluster -->\n"
        "\n```bash\nkubectl get jobs\n```\n\n```yaml\nkind: Job\n```\n\n"
        "<!-- file: corral.toml -->\n```toml\n[pools]\nbackfill = 2\n```\n\n"
        "- in a list:\n\n  <!-- run: exits 1 -->\n  ```python\n  raise SystemExit(1)\n  ```\n",
    )
    assert [(b.line, b.language, b.marker) for b in found] == [
        (3, "shell", None),
        (9, "shell", Marker("not run", reason="needs a Kubernetes cluster")),
        (18, "toml", Marker("file", path="corral.toml")),
        (26, "python", Marker("exits", code=1)),
    ]
    assert found[3].text == "raise SystemExit(1)\n", "indented blocks are dedented"
    assert [b.runs for b in found] == [True, False, False, True]


def test_a_console_block_runs_its_commands_only(tmp_path: Path) -> None:
    (block,) = page(
        tmp_path, "```console\n$ corral check \\\n    --config x\nall 10 limits nest\n$ true\n```\n"
    )
    assert block.script() == "corral check \\\n    --config x\ntrue\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<!-- skip this -->\n```sh\ntrue\n```\n", "unknown marker <!-- skip this -->"),
        ("<!-- not run: -->\n```sh\ntrue\n```\n", "unknown marker"),
        ("<!-- run: exits -->\n```sh\ntrue\n```\n", "unknown marker"),
        ("<!-- file: ../escape.toml -->\n```toml\n```\n", "must be a path inside"),
        ("<!-- not run: later -->\nSome prose.\n\n```sh\ntrue\n```\n", "stands before no example"),
        ("```sh\ntrue\n```\n<!-- not run: at the end -->\n", "stands before no example"),
        ("<!-- not run: yaml -->\n```yaml\nkind: Job\n```\n", "stands before no example"),
    ],
)
def test_a_bad_or_misplaced_marker_is_an_error(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(MarkerError, match=message):
        page(tmp_path, text)


def test_plain_comments_away_from_blocks_are_prose(tmp_path: Path) -> None:
    (block,) = page(tmp_path, "<!-- a note for editors -->\nText.\n\n```sh\ntrue\n```\n")
    assert block.marker is None


@pytest.mark.parametrize(
    ("language", "text", "problem"),
    [
        ("sh", "if true; then\n", "syntax error"),
        ("python", "def f(:\n", "line 1"),
        ("toml", "[pools\n", "Expected"),
        ("sh", "echo fine\n", None),
    ],
)
def test_parse_problems(tmp_path: Path, language: str, text: str, problem: str | None) -> None:
    (block,) = page(tmp_path, f"```{language}\n{text}```\n")
    found = doc_examples.parse_problem(block)
    assert (found is None) if problem is None else (problem in (found or ""))
