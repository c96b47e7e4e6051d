"""`corral lint`: read Kubernetes manifests (YAML, many documents a file), or a cluster's
Deployments and StatefulSets, and report what would hurt corral, with file and line.

Rules:

    worker-grace   a workload whose container runs `corral worker` (directly, after an
                   entrypoint `corral`, as `python -m corral`, or in `sh -c`) whose
                   terminationGracePeriodSeconds (30 when unset), less what its preStop
                   hook takes (`sleep N`, or a sleep handler), is not above the drain
                   (timeouts.drain_timeout, or a longer `corral.dev/drain-seconds`) plus
                   timeouts.margin: a rollout kills running tasks mid-drain. A preStop hook
                   whose time cannot be read is a note (it does not fail the lint)
    grace-period   any other corral Deployment (label `corral.dev/component`, or an
                   annotation `corral.dev/drain-seconds`) still on the default
                   terminationGracePeriodSeconds (30), or not above its declared drain time:
                   Kubernetes kills the pod before it has finished its tick and its launches
    job-deadline   a Job or Workflow carrying corral's labels whose activeDeadlineSeconds
                   is past corral's attempt_deadline: recovery would take a normally running
                   attempt for a dead one
    unlabelled     a Job or Workflow in the namespace corral manages without corral's labels:
                   corral neither sees it nor recovers it

A workload read from a cluster (`lint_cluster`) has the path
`cluster:<context>/<namespace>/<kind>/<name>` and line 0.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from corral import clock, config, errors, model
from corral.executors import builtin

DRAIN = model.LABEL_PREFIX + "drain-seconds"
COMPONENT = model.LABEL_PREFIX + "component"
DEFAULT_GRACE = 30
WORKLOADS = ("Deployment", "StatefulSet")
RUNS = ("Job", "Workflow")
TEMPLATE = ("spec", "template", "spec")
POD_SPECS: Mapping[str, tuple[str, ...]] = {
    "Deployment": TEMPLATE,
    "StatefulSet": TEMPLATE,
    "ReplicaSet": TEMPLATE,
    "DaemonSet": TEMPLATE,
    "Pod": ("spec",),
}
"""Where each kind that may run `corral worker` keeps its pod's spec."""
ERROR, NOTE = "error", "note"
"""A finding's level: errors fail the lint, notes are only told."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem in one document."""

    path: str
    line: int
    rule: str
    kind: str
    name: str
    message: str
    level: str = ERROR

    def __str__(self) -> str:
        rule = self.rule if self.level == ERROR else f"{self.rule} ({self.level})"
        return f"{self.path}:{self.line}: {rule}: {self.kind} {self.name}: {self.message}"

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


async def lint_cluster(
    settings: config.Settings, *, context: str | None = None, namespace: str | None = None
) -> list[Finding]:
    """Findings in the Deployments and StatefulSets of a live cluster (of `namespace`, or of
    all), reached as the kubernetes executor reaches it (`executors.kubernetes`: its
    kubeconfig, or the pod's service account), on kubeconfig context `context` if given."""
    k8s = settings.executors.kubernetes
    if context is not None:
        k8s = k8s.model_copy(update={"context": context})
    kube_workloads = builtin.cluster_module("kube_workloads", "reading a cluster (--cluster)")
    try:
        read = await kube_workloads.list_workloads(
            k8s, namespace=namespace, clock=clock.SystemClock()
        )
    except errors.ConfigError as exc:
        raise errors.ConfigError(
            f"{exc}; or point KUBECONFIG at the cluster's kubeconfig file, and name one of its"
            " contexts with --context"
        ) from None
    found: list[Finding] = []
    for obj in read.items:
        meta = _mapping(obj.get("metadata"))
        where = (
            f"cluster:{read.context}/{meta.get('namespace')}/{obj.get('kind')}/{meta.get('name')}"
        )
        found += _lint_doc(_Doc(obj, None, where), settings)
    return found


@dataclass(frozen=True, slots=True)
class _Doc:
    data: Mapping[str, Any]
    node: yaml.Node | None
    path: str

    @property
    def kind(self) -> str:
        return str(self.data.get("kind"))

    @property
    def name(self) -> str:
        return str(_get(self.data, "metadata", "name") or "(unnamed)")

    def line(self, *keys: str | int) -> int:
        """The 1-based line of the deepest of `keys` (a mapping's key, a list's index) that
        is present; 0 for an object read from a cluster."""
        if self.node is None:
            return 0
        node, line = self.node, self.node.start_mark.line
        for key in keys:
            if isinstance(node, yaml.SequenceNode) and isinstance(key, int):
                if key >= len(node.value):
                    break
                node = node.value[key]
                line = node.start_mark.line
                continue
            if not isinstance(node, yaml.MappingNode):
                break
            pair = next(((k, v) for k, v in node.value if getattr(k, "value", None) == key), None)
            if pair is None:
                break
            line, node = pair[0].start_mark.line, pair[1]
        return line + 1

    def finding(self, rule: str, message: str, *keys: str | int, level: str = ERROR) -> Finding:
        return Finding(self.path, self.line(*keys), rule, self.kind, self.name, message, level)


def _lint_doc(doc: _Doc, settings: config.Settings) -> list[Finding]:
    if workers := _worker_containers(doc):
        return list(_worker_grace(doc, workers, settings))
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


# --- worker-grace: the window a stopping `corral worker` has to drain in ------------------

WORKER_GRACE = "worker-grace"
SHELLS = frozenset({"sh", "bash", "dash", "ash", "zsh", "ksh"})
SEPARATORS = frozenset({";", "&&", "||", "|", "&"})
_PYTHON = re.compile(r"python[0-9.]*")
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)([smhd]?)")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True, slots=True)
class _Worker:
    """A container that runs `corral worker`: where it is, and how a message names it."""

    index: int
    spec: Mapping[str, Any]
    prefix: str  # "container NAME: " in a pod of several containers, else ""


@dataclass(frozen=True, slots=True)
class _Drain:
    """How long the worker drains, and how a message names where that comes from."""

    seconds: float
    said: str


@dataclass(frozen=True, slots=True)
class _PreStop:
    """What a container's preStop hook takes out of the grace period: `seconds` (at least
    that, when not `known`: how long the rest takes cannot be read)."""

    seconds: float
    said: str
    known: bool


def _worker_containers(doc: _Doc) -> list[_Worker]:
    pod = POD_SPECS.get(doc.kind)
    containers = _get(doc.data, *pod, "containers") if pod else None
    if not isinstance(containers, list):
        return []
    labelled = COMPONENT in _mapping(_get(doc.data, "metadata", "labels"))
    return [
        _Worker(index, spec, f"container {spec.get('name')}: " if len(containers) > 1 else "")
        for index, spec in enumerate(containers)
        if isinstance(spec, Mapping) and _runs_worker(spec, labelled=labelled)
    ]


def _runs_worker(container: Mapping[str, Any], *, labelled: bool) -> bool:
    """Whether the container runs `corral worker`. With no `command`, the image's entrypoint
    runs the args: `worker ...` alone counts for corral's image, or a corral workload."""
    command, args = _words(container.get("command")), _words(container.get("args"))
    if command:
        return _command_runs_worker(command + args)
    image = str(container.get("image") or "").split("@")[0]
    corral_image = PurePosixPath(image).name.split(":")[0].startswith("corral")
    if _subcommand(args) == "worker" and (labelled or corral_image):
        return True
    return _command_runs_worker(args)


def _command_runs_worker(words: Sequence[str]) -> bool:
    """Whether a command line runs `corral worker`: after any wrapper (`tini --`, `uv run`,
    `exec`), as `corral` or `python -m corral`, or inside a shell's `-c` script."""
    for i in range(len(words)):
        rest = _after_corral(words, i)
        if rest is not None and _subcommand(rest) == "worker":
            return True
        if (script := _shell_script(words, i)) is not None:
            return _command_runs_worker(_shell_words(script))
    return False


def _after_corral(words: Sequence[str], i: int) -> list[str] | None:
    """The words after `corral` (or `python -m corral`) when words[i] starts one, else None."""
    name = PurePosixPath(words[i]).name
    if name == "corral":
        return list(words[i + 1 :])
    if not _PYTHON.fullmatch(name):
        return None
    j = i + 1
    while j < len(words) and words[j].startswith("-") and words[j] not in ("-m", "-mcorral"):
        j += 1  # python's own flags: -u, -O, -B
    if list(words[j : j + 2]) == ["-m", "corral"]:
        return list(words[j + 2 :])
    return list(words[j + 1 :]) if words[j : j + 1] == ["-mcorral"] else None


def _subcommand(rest: Sequence[str]) -> str | None:
    """corral's command in the words after its name, past the global options (--config)."""
    j = 0
    while j < len(rest) and rest[j].startswith("-"):
        j += 2 if rest[j] == "--config" else 1
    return rest[j] if j < len(rest) else None


def _shell_script(words: Sequence[str], i: int) -> str | None:
    """The script of `sh -c SCRIPT` (`-ec`, `-lc` too) when words[i] is a shell."""
    if PurePosixPath(words[i]).name not in SHELLS:
        return None
    for j in range(i + 1, len(words) - 1):
        if not words[j].startswith("-") or words[j].startswith("--"):
            return None
        if "c" in words[j]:
            return words[j + 1]
    return None


def _shell_words(script: str) -> list[str]:
    """A shell script's words, `;`, `&&`, `|` and line ends as words of their own."""
    lexer = shlex.shlex(script.replace("\n", " ; "), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:  # an unclosed quote: not a script this can read
        return []


def _worker_grace(
    doc: _Doc, workers: Sequence[_Worker], settings: config.Settings
) -> Iterator[Finding]:
    pod = POD_SPECS[doc.kind]
    grace = _get(doc.data, *pod, "terminationGracePeriodSeconds")
    if grace is not None and not _is_number(grace):
        yield doc.finding(
            WORKER_GRACE,
            f"terminationGracePeriodSeconds {grace!r} is not a number of seconds",
            *pod,
            "terminationGracePeriodSeconds",
        )
        return
    drain = _worker_drain(doc, settings)
    if isinstance(drain, Finding):
        yield drain
        return
    margin = settings.timeouts.margin.total_seconds()
    for worker in workers:
        if found := _worker_window(doc, worker, grace, drain, margin):
            yield found


def _worker_drain(doc: _Doc, settings: config.Settings) -> _Drain | Finding:
    """timeouts.drain_timeout, or the annotation's drain when that is longer (a worker may
    run with settings of its own; to lint a shorter one, lint with those: --config)."""
    own = settings.timeouts.drain_timeout.total_seconds()
    declared = _mapping(_get(doc.data, "metadata", "annotations")).get(DRAIN)
    if declared is None:
        return _Drain(own, f"drain_timeout {own:g}s")
    try:
        seconds = float(declared)
    except (TypeError, ValueError):
        seconds = math.nan
    if not math.isfinite(seconds):
        return doc.finding(
            WORKER_GRACE,
            f"{DRAIN} {declared!r} is not a number of seconds",
            "metadata",
            "annotations",
            DRAIN,
        )
    if seconds <= own:
        return _Drain(own, f"drain_timeout {own:g}s")
    return _Drain(seconds, f"the drain of {seconds:g}s ({DRAIN})")


def _worker_window(
    doc: _Doc, worker: _Worker, grace: float | None, drain: _Drain, margin: float
) -> Finding | None:
    """The finding (or note) on one worker container's window: the grace period less its
    preStop hook's time must stay above the drain plus the margin."""
    pod = POD_SPECS[doc.kind]
    hook = _pre_stop(worker.spec)
    window = float(DEFAULT_GRACE if grace is None else grace)
    said = (
        f"terminationGracePeriodSeconds {DEFAULT_GRACE} (default)"
        if grace is None
        else f"terminationGracePeriodSeconds {grace:g}"
    )
    taken = hook.seconds if hook else 0.0
    needed = f"{drain.said} + margin {margin:g}s"
    if window - taken > drain.seconds + margin:
        if hook is None or hook.known:
            return None
        return doc.finding(
            WORKER_GRACE,
            f"{worker.prefix}{hook.said} runs inside {said}, and how long it takes cannot be"
            f" read: {window:g}s less that time must stay above {needed}",
            *pod,
            "containers",
            worker.index,
            "lifecycle",
            "preStop",
            level=NOTE,
        )
    least = math.floor(taken + drain.seconds + margin) + 1
    short = _too_short(said, hook, window, needed, least)
    where = pod if grace is None else (*pod, "terminationGracePeriodSeconds")
    return doc.finding(
        WORKER_GRACE,
        f"{worker.prefix}{short}; else a rollout kills the worker's running tasks mid-drain",
        *where,
    )


def _too_short(said: str, hook: _PreStop | None, window: float, needed: str, least: int) -> str:
    """Why a worker's grace period (`said`, `window` seconds) is too short, and the least
    it should be: its preStop hook runs inside it, for a time read or not."""
    if hook is None:
        return f"{said} is not above {needed}: set it to at least {least}"
    if hook.known:
        return (
            f"{said} less {hook.said} leaves {window - hook.seconds:g}s, not above {needed}: set"
            f" it to at least {least} (a preStop hook runs inside the grace period)"
        )
    return (
        f"{said} less at least {hook.seconds:g}s for {hook.said} is not above {needed}: set it"
        f" to at least {least} plus what the hook takes beyond that (it cannot be read)"
    )


def _pre_stop(container: Mapping[str, Any]) -> _PreStop | None:
    """What the container's preStop hook takes: a sleep handler's seconds, an exec's
    `sleep N` (alone or as a shell's only commands); anything else cannot be read."""
    hook = _mapping(_get(container, "lifecycle", "preStop"))
    if "sleep" in hook:
        seconds = _get(hook, "sleep", "seconds")
        if _is_number(seconds) and seconds >= 0:
            return _PreStop(float(seconds), f"the preStop sleep of {seconds:g}s", True)
        return _PreStop(0.0, f"the preStop sleep of {seconds!r}", False)
    if "exec" in hook:
        return _exec_time(_words(_get(hook, "exec", "command")))
    if "httpGet" in hook:
        return _PreStop(0.0, "the preStop httpGet hook", False)
    return None


def _exec_time(words: list[str]) -> _PreStop:
    script = _shell_script(words, 0) if words else None
    commands = _commands(_shell_words(script)) if script is not None else [words]
    total = 0.0
    for command in commands:
        seconds = _sleep_seconds(command[1:] if command[:1] == ["exec"] else command)
        if seconds is None:
            return _PreStop(total, f"the preStop exec {shlex.join(words)!r}", False)
        total += seconds
    return _PreStop(total, f"the preStop sleep of {total:g}s", True)


def _commands(words: Sequence[str]) -> list[list[str]]:
    """A script's words split into its commands."""
    commands: list[list[str]] = [[]]
    for word in words:
        if word in SEPARATORS:
            commands.append([])
        else:
            commands[-1].append(word)
    return [command for command in commands if command] or [[]]


def _sleep_seconds(command: Sequence[str]) -> float | None:
    """The seconds `sleep ARG...` waits (ARG: 10, 1.5, 2m), or None for any other command."""
    if len(command) < 2 or PurePosixPath(command[0]).name != "sleep":
        return None
    total = 0.0
    for arg in command[1:]:
        if (match := _DURATION.fullmatch(arg)) is None:
            return None
        total += float(match[1]) * _UNIT[match[2]]
    return total


def _words(value: Any) -> list[str]:
    return [str(word) for word in value] if isinstance(value, list) else []


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


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
