"""Documents of objects kept as code (`corral apply`, `corral export`), as values: read from
YAML or TOML text, compared field by field with what is stored, and written back. Pure:
the files are read by the CLI, what each kind's fields may be is checked by the client
(corral.client.apply_kinds) with the checks the CLI and the API use for it.

A document is a mapping with `kind`, `name`, an optional `tenant` and the kind's own
fields. YAML text holds any number of documents, separated by `---` (a document that is
a list holds one per item, so JSON, which YAML reads, may give a list); TOML text holds
one document (its top-level keys), or several as an array of tables named `document`
(`[[document]]`). Documents are numbered from 1 within their file.

Secret fields are written as KEPT, which reads back as "keep the value stored".
"""

from __future__ import annotations

import copy
import datetime as dt
import functools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from corral import errors

KEPT = "kept"
"""What an export writes for a secret, and apply reads as "keep the stored value"."""
TOML_ARRAY = "document"
"""The array of tables a TOML file holds its documents in, when it holds more than one."""
SUFFIXES = (".yaml", ".yml", ".json", ".toml")
"""The files of a folder that apply reads (.json is read as YAML, which it is)."""


@dataclass(frozen=True, slots=True)
class Document:
    """One document: `source` the file it came from ("-": standard input; "documents": a
    request's list of them), `index` its place in it (from 1)."""

    kind: str
    name: str
    tenant: str | None
    fields: Mapping[str, Any]
    source: str
    index: int

    @property
    def where(self) -> str:
        """How errors name it: its file, its number and its name."""
        return f"{self.source}: document {self.index} ({self.kind} {self.name!r})"


class Action(StrEnum):
    """What apply does to one object."""

    CREATE = "create"
    CHANGE = "change"
    DELETE = "delete"
    UNCHANGED = "unchanged"


SIGNS = {Action.CREATE: "+", Action.CHANGE: "~", Action.DELETE: "-", Action.UNCHANGED: "="}
ADOPTED = "(taken over)"
"""What a plan's line says after an object made by hand that the apply takes over."""


@dataclass(frozen=True, slots=True)
class Step:
    """One object of the plan: what apply does to it, and (a change) the fields that change,
    as dotted paths (`spec.command`). `adopted`: made by hand, and taken over by this apply
    (managed from now on, so `--prune` may delete it), whether its fields change or not."""

    action: Action
    kind: str
    name: str
    fields: tuple[str, ...] = field(default=())
    adopted: bool = False

    @property
    def writes(self) -> bool:
        """Whether applying it writes anything: all but an unchanged managed object."""
        return self.action != Action.UNCHANGED or self.adopted


# --- reading ---------------------------------------------------------------------------------


def parse(text: str, source: str) -> list[Document]:
    """The documents of a file's `text` (TOML when `source` ends in .toml, else YAML);
    InvalidInput naming the file, the document and the field for one that is not a
    document."""
    raw = _toml(text, source) if source.endswith(".toml") else _yaml(text, source)
    return [document(item, source, i) for i, item in enumerate(raw, start=1)]


@functools.cache
def _loader() -> Any:
    """YAML's safe loader with YAML 1.2's booleans (true and false): YAML 1.1 reads `on`,
    `off`, `yes` and `no` as booleans too, and a rule's `on` is a field's name."""
    import yaml  # only where documents are read: not for every command

    bool_tag = "tag:yaml.org,2002:bool"

    class Loader(yaml.SafeLoader):
        pass

    Loader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in found if tag != bool_tag]
        for first, found in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    Loader.add_implicit_resolver(
        bool_tag, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
    )
    return Loader


def _yaml(text: str, source: str) -> list[Any]:
    import yaml

    try:
        loaded = list(yaml.load_all(text, Loader=_loader()))  # a safe loader (_loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise errors.InvalidInput(f"{source}: not YAML{line}: {problem}") from None
    found: list[Any] = []
    for item in loaded:
        if item is None:
            continue  # an empty document, e.g. after a last `---`
        found.extend(item if isinstance(item, list) else [item])
    return [_plain(item) for item in found]


def _toml(text: str, source: str) -> list[Any]:
    import tomllib

    try:
        loaded = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise errors.InvalidInput(f"{source}: not TOML: {exc}") from None
    if "kind" in loaded:
        return [_plain(loaded)]
    many = loaded.get(TOML_ARRAY)
    if set(loaded) != {TOML_ARRAY} or not isinstance(many, list):
        raise errors.InvalidInput(
            f"{source}: a TOML file holds one document (with its `kind` at the top) or"
            f" several as [[{TOML_ARRAY}]] tables"
        )
    return [_plain(item) for item in many]


def _plain(value: Any) -> Any:
    """`value` with the times YAML and TOML read into dates written back as ISO 8601
    text, as a JSON body gives them."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    return value


def document(raw: Any, source: str, index: int) -> Document:
    """One document of `raw` (a mapping with kind, name, and perhaps tenant); InvalidInput
    naming the file, the document and the field if not."""
    where = f"{source}: document {index}"
    if not isinstance(raw, Mapping):
        raise errors.InvalidInput(f"{where}: must be a mapping with kind and name")
    kind, name, tenant = raw.get("kind"), raw.get("name"), raw.get("tenant")
    if not isinstance(kind, str) or not kind:
        raise errors.InvalidInput(f"{where}: kind: required, e.g. Schedule")
    if not isinstance(name, str) or not name:
        raise errors.InvalidInput(f"{where} ({kind}): name: required, a string")
    if tenant is not None and not isinstance(tenant, str):
        raise errors.InvalidInput(f"{where} ({kind} {name!r}): tenant: a tenant's name")
    if not all(isinstance(k, str) for k in raw):
        raise errors.InvalidInput(f"{where} ({kind} {name!r}): every key must be a string")
    fields = {k: v for k, v in raw.items() if k not in ("kind", "name", "tenant")}
    return Document(kind, name, tenant, fields, source, index)


def twins(documents: Sequence[Document]) -> None:
    """InvalidInput naming both places of an object that two documents give."""
    seen: dict[tuple[str, str], Document] = {}
    for doc in documents:
        if (first := seen.get((doc.kind, doc.name))) is not None:
            raise errors.InvalidInput(
                f"{doc.where}: name: {doc.kind} {doc.name!r} is given twice (first in"
                f" {first.source}, document {first.index})"
            )
        seen[(doc.kind, doc.name)] = doc


def located(exc: errors.CorralError, where: str) -> errors.CorralError:
    """`exc` (of its own class, with its own attributes) saying first where it comes from:
    a file, a document, its name."""
    found = copy.copy(exc)
    found.args = (f"{where}: {exc}",)
    return found


# --- comparing -------------------------------------------------------------------------------


def changed(wanted: Mapping[str, Any], held: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The fields (dotted paths into mappings) whose values differ between `wanted` and
    `held`, sorted; a field one has and the other has not differs."""
    found = []
    for key in sorted(set(wanted) | set(held)):
        path = f"{prefix}{key}"
        mine, theirs = wanted.get(key), held.get(key)
        if isinstance(mine, Mapping) and isinstance(theirs, Mapping):
            found.extend(changed(mine, theirs, f"{path}."))
        elif key not in wanted or key not in held or _json(mine) != _json(theirs):
            found.append(path)
    return found


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def plan_dict(tenant: str, steps: Iterable[Step], *, dry_run: bool) -> dict[str, Any]:
    """A plan as `--json` and the API give it."""
    steps = list(steps)
    return {
        "tenant": tenant,
        "dry_run": dry_run,
        "steps": [
            {
                "action": s.action.value,
                "kind": s.kind,
                "name": s.name,
                "fields": list(s.fields),
                "adopted": s.adopted,
            }
            for s in steps
        ],
        "counts": {a.value: sum(1 for s in steps if s.action == a) for a in Action},
    }


def plan_lines(steps: Iterable[Step]) -> list[str]:
    """A plan as the CLI prints it: one line per object, `+` create, `~` change (with its
    fields), `-` delete, `=` unchanged; ` (taken over)` after one made by hand that the
    apply takes over."""
    lines = []
    for s in steps:
        said = f"{SIGNS[s.action]} {s.kind} {s.name}"
        said = f"{said}: {', '.join(s.fields)}" if s.fields else said
        lines.append(f"{said} {ADOPTED}" if s.adopted else said)
    return lines


def summary(steps: Iterable[Step]) -> str:
    """How many objects each action touches, in words (and how many are taken over)."""
    counted = {a: 0 for a in Action}
    adopted = 0
    for s in steps:
        counted[s.action] += 1
        adopted += s.adopted
    said = (
        f"{counted[Action.CREATE]} to create, {counted[Action.CHANGE]} to change,"
        f" {counted[Action.DELETE]} to delete, {counted[Action.UNCHANGED]} unchanged"
    )
    return f"{said}; {adopted} made by hand taken over" if adopted else said


# --- writing ---------------------------------------------------------------------------------


def dumped(documents: Sequence[Mapping[str, Any]], *, as_json: bool = False) -> str:
    """Documents as YAML (one per `---`), or as a JSON list, which apply reads back too."""
    if as_json:
        return json.dumps(list(documents), indent=2) + "\n"
    import yaml

    return yaml.safe_dump_all(
        [dict(d) for d in documents], sort_keys=False, default_flow_style=False, explicit_start=True
    )
