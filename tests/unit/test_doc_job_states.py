"""The table of job states in docs/how-a-job-runs.md draws model.JOB_TRANSITIONS: every
arrow the model allows, and no other."""

from __future__ import annotations

import re
from pathlib import Path

from corral import model

PAGE = Path(__file__).resolve().parents[2] / "docs" / "how-a-job-runs.md"


def documented_arrows() -> set[tuple[str, str]]:
    text = PAGE.read_text(encoding="utf-8")
    section = text.split("## Job states", 1)[1].split("\n## ", 1)[0]
    arrows = set()
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        for frm in re.findall(r"`(\w+)`", cells[0]):
            for to in re.findall(r"`(\w+)`", cells[1]):
                arrows.add((frm, to))
    return arrows


def test_the_job_states_table_is_the_transition_table() -> None:
    allowed = {(frm.value, to.value) for frm, tos in model.JOB_TRANSITIONS.items() for to in tos}
    assert documented_arrows() == allowed
