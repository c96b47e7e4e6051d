"""The fenced examples of README.md and docs/: found, their markers read, checked to parse.

Every ```sh, ```bash, ```shell, ```console, ```python and ```toml block is an example.
An HTML comment on the last non-blank line before a block (mkdocs does not render it)
says how the block is used; a block without one runs:

    <!-- not run: REASON -->          checked to parse only (a cluster, docker, an outside URL)
    <!-- file: PATH -->               written to PATH in the page's scratch folder, not run
                                      (`file: corral.toml` is the settings of the blocks after it)
    <!-- run: exits N -->             runs, and must exit with status N
    <!-- run: until jobs end -->      a long-running command (`corral serve`): stopped with
                                      SIGTERM once every job in the scratch store has ended

A shell block runs with `bash -e -o pipefail`; a console block's commands are its `$ `
lines (output lines are not checked); a Python block runs as a script; a TOML block must
be valid corral settings. Any other comment before a block, or a marker that stands
before no block, is an error, so no block is skipped by accident.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

LANGUAGES = {
    "sh": "shell",
    "bash": "shell",
    "shell": "shell",
    "console": "console",
    "python": "python",
    "py": "python",
    "toml": "toml",
}
"""A fence's info word -> how the block is checked; blocks in other languages are prose."""

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^\s`]*)[^`]*$")
_COMMENT = re.compile(r"^\s*<!--(?P<body>.*?)-->\s*$")
_MARKER_WORDS = re.compile(r"^\s*<!--\s*(not run|file|run)\b")


class MarkerError(ValueError):
    """Raised when a comment before a block is not a known marker, or a marker is misplaced."""


@dataclass(frozen=True, slots=True)
class Marker:
    """How a block is used: `not run` (with `reason`), `file` (with `path`), `exits`
    (with `code`) or `until jobs end`."""

    kind: str
    reason: str = ""
    path: str = ""
    code: int = 0

    @classmethod
    def parse(cls, body: str, where: str) -> Marker:
        text = " ".join(body.split())
        if (m := re.fullmatch(r"not run: (.+)", text)) and m[1].strip():
            return cls("not run", reason=m[1].strip())
        if m := re.fullmatch(r"file: (\S+)", text):
            path = PurePosixPath(m[1])
            if path.is_absolute() or ".." in path.parts:
                raise MarkerError(
                    f"{where}: file: {m[1]!r} must be a path inside the page's folder"
                )
            return cls("file", path=str(path))
        if m := re.fullmatch(r"run: exits (\d{1,3})", text):
            return cls("exits", code=int(m[1]))
        if text == "run: until jobs end":
            return cls("until jobs end")
        raise MarkerError(
            f"{where}: unknown marker <!-- {text} -->; use 'not run: REASON', 'file: PATH',"
            " 'run: exits N' or 'run: until jobs end'"
        )


@dataclass(frozen=True, slots=True)
class Block:
    """One fenced example: where it is, its language, its text and its marker."""

    path: Path
    line: int
    language: str
    text: str
    marker: Marker | None

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.marker is None or self.marker.kind in ("exits", "until jobs end")

    def script(self) -> str:
        """The text to run: a console block's commands only."""
        if self.language != "console":
            return self.text
        commands, going_on = [], False
        for line in self.text.splitlines():
            if going_on or line.startswith("$ "):
                commands.append(line if going_on else line[2:])
                going_on = line.rstrip().endswith("\\")
        return "\n".join(commands) + "\n"


def blocks(path: Path, shown_as: Path | None = None) -> list[Block]:
    """Every example block of a Markdown file, in order. MarkerError on a bad marker."""
    lines = path.read_text(encoding="utf-8").splitlines()
    name = shown_as or path
    found: list[Block] = []
    pending: tuple[int, str] | None = None  # a comment waiting for its block
    i = 0
    while i < len(lines):
        line = lines[i]
        if fence := _FENCE.match(line):
            end = _closing(lines, i, fence["fence"])
            indent = len(fence["indent"])
            body = "\n".join(text[indent:] for text in lines[i + 1 : end]) + "\n"
            language = LANGUAGES.get(fence["info"].lower())
            marker = None
            if language is None:
                _unplaced(pending, name)
            else:
                if pending is not None:
                    marker = Marker.parse(pending[1], f"{name}:{pending[0]}")
                found.append(Block(name, i + 1, language, body, marker))
            pending, i = None, end + 1
            continue
        if comment := _COMMENT.match(line):
            _unplaced(pending, name)
            pending = (i + 1, comment["body"])
        elif line.strip():
            _unplaced(pending, name)
            pending = None
        i += 1
    _unplaced(pending, name)
    return found


def _closing(lines: list[str], start: int, fence: str) -> int:
    for j in range(start + 1, len(lines)):
        text = lines[j].strip()
        if text and set(text) == {fence[0]} and len(text) >= len(fence):
            return j
    return len(lines)


def _unplaced(pending: tuple[int, str] | None, name: Path) -> None:
    if pending is not None and _MARKER_WORDS.match(f"<!--{pending[1]}-->"):
        raise MarkerError(f"{name}:{pending[0]}: a marker that stands before no example block")


def parse_problem(block: Block) -> str | None:
    """Why the block does not parse (bash -n, compile, tomllib), or None."""
    if block.language in ("shell", "console"):
        checked = subprocess.run(
            ["bash", "-n"], input=block.script(), capture_output=True, text=True, timeout=30
        )
        return checked.stderr.strip() or None if checked.returncode else None
    if block.language == "python":
        try:
            compile(block.text, block.where, "exec", dont_inherit=True)
        except SyntaxError as exc:
            return f"line {exc.lineno}: {exc.msg}"
        return None
    try:
        tomllib.loads(block.text)
    except tomllib.TOMLDecodeError as exc:
        return str(exc)
    return None
