"""`corral lint`: read Kubernetes manifests (YAML, many documents a file) and report what
would hurt corral, with file and line.

Rules:

    grace-period   a corral Deployment (label `corral.dev/component`, or an annotation
                   `corral.dev/drain-seconds`) still on the default
                   terminationGracePeriodSeconds (30), or not above its declared drain time:
                   Kubernetes kills the pod before it has finished its tick and its launches
    job-deadline   a Job or Workflow carrying corral's labels whose activeDeadlineSeconds
                   is past corral's attempt_deadline: recovery would take a normally running
                   attempt for a dead one
    unlabelled     a Job or Workflow in the namespace corral manages without corral's labels:
                   corral neither sees it nor recovers it
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from corral import config, errors, model

DRAIN = model.LABEL_PREFIX + "drain-seconds"
COMPONENT = model.LABEL_PREFIX + "component"
DEFAULT_GRACE = 30
WORKLOADS = ("Deployment", "StatefulSet")
RUNS = ("Job", "Workflow")


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem in one document."""

    path: str
    line: int
    rule: str
    kind: str
    name: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.rule}: {self.kind} {self.name}: {self.message}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def lint_paths(paths: Sequence[Path], settings: config.Settings) -> list[Finding]:
    """Findings in every YAML file of `paths` (folders are read recursively)."""
    found: list[Finding] = []
    for file in _files(paths):
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise errors.InvalidInput(f"{file}: cannot read it as UTF-8 text: {exc}") from None
        found += lint_text(text, str(file), settings)
    return found


def lint_text(text: str, path: str, settings: config.Settings) -> list[Finding]:
    """Findings in one file's text. InvalidInput when it is not YAML."""
    try:
        docs = [(node, _construct(node)) for node in yaml.compose_all(text, yaml.SafeLoader)]
    except yaml.YAMLError as exc:
        raise errors.InvalidInput(f"{path}: not valid YAML: {exc}") from None
    found: list[Finding] = []
    for node, doc in docs:
        found += _lint_node(node, doc, path, settings)
    return found


def _lint_node(node: Any, doc: Any, path: str, settings: config.Settings) -> list[Finding]:
    """A document, or each item of a `kind: List` (as `kubectl get -o yaml` writes)."""
    if not isinstance(doc, Mapping) or "kind" not in doc:
        return []
    if doc.get("kind") == "List" and isinstance(doc.get("items"), list):
        items = _child(node, "items")
        nodes = items.value if isinstance(items, yaml.SequenceNode) else [None] * len(doc["items"])
        found: list[Finding] = []
        for item_node, item in zip(nodes, doc["items"], strict=False):
            found += _lint_node(item_node or node, item, path, settings)
        return found
    return _lint_doc(_Doc(doc, node, path), settings)


def _child(node: Any, key: str) -> Any:
    if isinstance(node, yaml.MappingNode):
        return next((v for k, v in node.value if getattr(k, "value", None) == key), None)
    return None


@dataclass(frozen=True, slots=True)
class _Doc:
    data: Mapping[str, Any]
    node: yaml.Node
    path: str

    @property
    def kind(self) -> str:
        return str(self.data.get("kind"))

    @property
    def name(self) -> str:
        return str(_get(self.data, "metadata", "name") or "(unnamed)")

    def line(self, *keys: str) -> int:
        """The 1-based line of the deepest of `keys` that is present."""
        node, line = self.node, self.node.start_mark.line
        for key in keys:
            if not isinstance(node, yaml.MappingNode):
                break
            pair = next(((k, v) for k, v in node.value if getattr(k, "value", None) == key), None)
            if pair is None:
                break
            line, node = pair[0].start_mark.line, pair[1]
        return line + 1

    def finding(self, rule: str, message: str, *keys: str) -> Finding:
        return Finding(self.path, self.line(*keys), rule, self.kind, self.name, message)


def _lint_doc(doc: _Doc, settings: config.Settings) -> list[Finding]:
    if doc.kind in WORKLOADS:
        return list(_grace_period(doc))
    if doc.kind in RUNS:
        return list(_runs(doc, settings))
    return []


def _grace_period(doc: _Doc) -> Iterator[Finding]:
    labels = _mapping(_get(doc.data, "metadata", "labels"))
    notes = _mapping(_get(doc.data, "metadata", "annotations"))
    if COMPONENT not in labels and DRAIN not in notes:
        return
    pod = ("spec", "template", "spec")
    grace = _get(doc.data, *pod, "terminationGracePeriodSeconds")
    drain = notes.get(DRAIN)
    if grace is None:
        yield doc.finding(
            "grace-period",
            f"terminationGracePeriodSeconds is not set, so it is {DEFAULT_GRACE}s: set it above"
            f" the time corral needs to drain (the {DRAIN} annotation)",
            *pod,
        )
        return
    try:
        needed = float(drain) if drain is not None else None
    except (TypeError, ValueError):
        yield doc.finding("grace-period", f"{DRAIN} {drain!r} is not a number of seconds")
        return
    if not isinstance(grace, int | float) or isinstance(grace, bool):
        yield doc.finding(
            "grace-period",
            f"terminationGracePeriodSeconds {grace!r} is not a number of seconds",
            *pod,
            "terminationGracePeriodSeconds",
        )
        return
    if needed is not None and grace <= needed:
        yield doc.finding(
            "grace-period",
            f"terminationGracePeriodSeconds {grace} is not above its drain time ({drain}s):"
            " Kubernetes would kill it mid-drain",
            *pod,
            "terminationGracePeriodSeconds",
        )


def _runs(doc: _Doc, settings: config.Settings) -> Iterator[Finding]:
    labels = _mapping(_get(doc.data, "metadata", "labels"))
    managed = labels.get(model.MANAGED_BY) == model.MANAGER
    namespace = _get(doc.data, "metadata", "namespace")
    corrals = settings.executors.kubernetes.namespace
    if not managed:
        if namespace == corrals:
            yield doc.finding(
                "unlabelled",
                f"it is in namespace {corrals!r}, which corral manages, but carries no"
                f" {model.MANAGED_BY} label: corral neither sees nor recovers it; submit it"
                " through corral (corral submit --executor kubernetes) or move it",
                "metadata",
            )
        return
    deadline = _get(doc.data, "spec", "activeDeadlineSeconds")
    limit = settings.timeouts.attempt_deadline.total_seconds()
    if isinstance(deadline, int | float) and deadline > limit:
        yield doc.finding(
            "job-deadline",
            f"activeDeadlineSeconds {deadline} is past timeouts.attempt_deadline ({limit:g}s):"
            " recovery would take it for dead while it still runs (see `corral check`)",
            "spec",
            "activeDeadlineSeconds",
        )


def _files(paths: Sequence[Path]) -> Iterator[Path]:
    for path in paths:
        if path.is_dir():
            yield from sorted(
                p for p in path.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file()
            )
        elif path.is_file():
            yield path
        else:
            raise errors.InvalidInput(f"{path}: no such file or folder")


def _construct(node: yaml.Node) -> Any:
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _get(data: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(data, Mapping):
            return None
        data = data.get(key)
    return data
