"""`corral lint` on manifests as users write them: findings with file, line and rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral import config, errors, lint

SETTINGS = config.Settings(executors={"kubernetes": {"namespace": "jobs"}})

MANIFESTS = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: corral-dispatcher
  labels:
    corral.dev/component: dispatcher
spec:
  template:
    spec:
      containers:
      - name: corral
        image: corral:1
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: corral-reconciler
  annotations:
    corral.dev/drain-seconds: "45"
spec:
  template:
    spec:
      terminationGracePeriodSeconds: 40
      containers:
      - name: corral
        image: corral:1
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  template:
    spec:
      containers:
      - name: web
        image: nginx
---
apiVersion: batch/v1
kind: Job
metadata:
  name: corral-7-1
  namespace: jobs
  labels:
    corral.dev/managed-by: corral
spec:
  activeDeadlineSeconds: 600
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: main
        image: busybox
---
apiVersion: batch/v1
kind: Job
metadata:
  name: hand-made
  namespace: jobs
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: main
        image: busybox
---
apiVersion: batch/v1
kind: Job
metadata:
  name: elsewhere
  namespace: other
spec:
  template:
    spec:
      restartPolicy: Never
      containers: []
"""


def test_each_rule_reports_file_line_and_what_to_do() -> None:
    found = lint.lint_text(MANIFESTS, "deploy/all.yaml", SETTINGS)
    assert [(f.line, f.rule, f.kind, f.name) for f in found] == [
        (9, "grace-period", "Deployment", "corral-dispatcher"),
        (23, "grace-period", "Deployment", "corral-reconciler"),
        (47, "job-deadline", "Job", "corral-7-1"),
        (57, "unlabelled", "Job", "hand-made"),
    ]
    assert str(found[0]).startswith(
        "deploy/all.yaml:9: grace-period: Deployment corral-dispatcher: terminationGracePeriodSeconds"
        " is not set, so it is 30s"
    )
    assert "not above its drain time (45s)" in found[1].message
    assert "past timeouts.attempt_deadline (240s)" in found[2].message
    assert "namespace 'jobs', which corral manages" in found[3].message


def test_clean_manifests_have_no_findings_and_bad_yaml_is_an_error(tmp_path: Path) -> None:
    ok = tmp_path / "k8s" / "ok.yml"
    ok.parent.mkdir()
    ok.write_text("kind: ConfigMap\nmetadata: {name: a}\n---\n# only a comment\n")
    assert lint.lint_paths([tmp_path], SETTINGS) == []
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: Job\n  metadata: [\n")
    with pytest.raises(errors.InvalidInput, match="bad.yaml: not valid YAML"):
        lint.lint_paths([bad], SETTINGS)
    with pytest.raises(errors.InvalidInput, match="no such file or folder"):
        lint.lint_paths([tmp_path / "missing.yaml"], SETTINGS)


def test_odd_manifests_are_findings_or_one_line_errors_never_a_crash(tmp_path: Path) -> None:
    listed = """\
apiVersion: v1
kind: List
items:
- apiVersion: batch/v1
  kind: Job
  metadata:
    name: from-kubectl
    namespace: jobs
  spec: {}
- just a string
---
kind: Deployment
metadata:
  name: odd
  labels: not-a-mapping
  annotations:
    corral.dev/drain-seconds: "20"
spec:
  template:
    spec:
      terminationGracePeriodSeconds: "${GRACE}"
"""
    found = lint.lint_text(listed, "odd.yaml", SETTINGS)
    assert [(f.line, f.rule, f.name) for f in found] == [
        (6, "unlabelled", "from-kubectl"),
        (21, "grace-period", "odd"),
    ]
    assert "'${GRACE}' is not a number of seconds" in found[1].message
    with pytest.raises(errors.InvalidInput, match="not valid YAML"):
        lint.lint_text("kind: Job\nmetadata: !Ref other\n", "tagged.yaml", SETTINGS)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("kind: Job\nmetadata: {name: caf\xe9}\n".encode("latin-1"))
    with pytest.raises(errors.InvalidInput, match="cannot read it as UTF-8"):
        lint.lint_paths([latin], SETTINGS)


# --- worker-grace ----------------------------------------------------------------------------


def worker(
    *,
    command: str = '["corral", "worker", "billing.app:app"]',
    args: str | None = None,
    grace: int | str | None = None,
    pre_stop: str | None = None,
    annotations: str | None = None,
    kind: str = "Deployment",
) -> str:
    """A worker workload, its pod spec at line 9 and its container's preStop at line 16."""
    lines = [
        "apiVersion: apps/v1",
        f"kind: {kind}",
        "metadata:",
        "  name: billing-worker",
        f"  annotations: {annotations or '{}'}",
        "spec:",
        "  replicas: 2",
        "  template:",
        "    spec:",
        f"      terminationGracePeriodSeconds: {'null' if grace is None else grace}",
        "      containers:",
        "      - name: worker",
        "        image: billing:1.4",
        f"        command: {command}",
        f"        args: {args or '[]'}",
        f"        lifecycle: {{preStop: {pre_stop}}}" if pre_stop else "        lifecycle: {}",
    ]
    return "\n".join(lines) + "\n"


def one(text: str, settings: config.Settings = SETTINGS) -> lint.Finding:
    [found] = lint.lint_text(text, "k8s/worker.yaml", settings)
    return found


def test_a_worker_on_the_default_grace_is_told_what_to_set() -> None:
    found = one(worker())
    assert (found.rule, found.kind, found.name, found.line) == (
        "worker-grace",
        "Deployment",
        "billing-worker",
        9,
    )
    assert found.level == "error"
    assert found.message.startswith(
        "terminationGracePeriodSeconds 30 (default) is not above drain_timeout 30s + margin 5s:"
        " set it to at least 36;"
    )


def test_an_explicit_grace_is_checked_against_drain_plus_margin() -> None:
    found = one(worker(grace=35))
    assert found.line == 10
    assert "terminationGracePeriodSeconds 35 is not above" in found.message
    assert "set it to at least 36" in found.message
    assert lint.lint_text(worker(grace=36), "w.yaml", SETTINGS) == []
    assert lint.lint_text(worker(grace=1800), "w.yaml", SETTINGS) == []
    longer = config.Settings(timeouts={"drain_timeout": "200s"})
    assert (
        "drain_timeout 200s + margin 5s: set it to at least 206"
        in one(worker(grace=200), longer).message
    )


def test_a_pre_stop_sleep_is_taken_out_of_the_window() -> None:
    found = one(worker(pre_stop='{exec: {command: ["sleep", "10"]}}'))
    assert found.message.startswith(
        "terminationGracePeriodSeconds 30 (default) less the preStop sleep of 10s leaves 20s,"
        " not above drain_timeout 30s + margin 5s: set it to at least 46"
    )
    for hook in (
        '{exec: {command: ["/bin/sleep", "10"]}}',
        '{exec: {command: ["sh", "-c", "sleep 10"]}}',
        '{exec: {command: ["/bin/sh", "-ec", "sleep 4; sleep 6s"]}}',
        "{sleep: {seconds: 10}}",
    ):
        assert "set it to at least 46" in one(worker(grace=45, pre_stop=hook)).message, hook
        assert lint.lint_text(worker(grace=46, pre_stop=hook), "w.yaml", SETTINGS) == [], hook
    assert (
        "preStop sleep of 120s"
        in one(worker(grace=100, pre_stop="{sleep: {seconds: 120}}")).message
    )


def test_a_pre_stop_whose_time_cannot_be_read_is_a_note_or_part_of_the_finding() -> None:
    hook = '{exec: {command: ["sh", "-c", "sleep 5 && /app/deregister"]}}'
    note = one(worker(grace=120, pre_stop=hook))
    assert (note.level, note.line, note.rule) == ("note", 16, "worker-grace")
    assert "the preStop exec \"sh -c 'sleep 5 && /app/deregister'\" runs inside" in note.message
    assert "how long it takes cannot be read" in note.message
    assert str(note).startswith("k8s/worker.yaml:16: worker-grace (note): Deployment")
    http = one(worker(grace=120, pre_stop="{httpGet: {path: /drain, port: 8080}}"))
    assert http.level == "note"
    assert "preStop httpGet hook" in http.message
    short = one(worker(pre_stop=hook))
    assert short.level == "error"
    assert "less at least 5s for the preStop exec" in short.message
    assert "set it to at least 41 plus what the hook takes" in short.message


def test_every_way_of_starting_a_worker_is_recognised() -> None:
    ways = [
        ('["corral"]', '["worker", "billing.app:app", "--concurrency", "4"]'),
        ('["/app/.venv/bin/corral", "--config", "/etc/corral/w.toml", "worker"]', None),
        ('["python", "-m", "corral", "worker", "billing.app:app"]', None),
        ('["python3.11", "-u", "-m", "corral", "worker", "billing.app:app"]', None),
        ('["sh", "-c", "cd /app && exec corral worker billing.app:app --queue mail"]', None),
        ('["/bin/bash", "-lc", "python -m corral --config=/c.toml worker a:app"]', None),
        ('["tini", "--", "corral", "worker", "a:app"]', None),
        ("null", '["corral", "worker", "a:app"]'),
    ]
    for command, args in ways:
        found = one(worker(command=command, args=args))
        assert found.rule == "worker-grace", (command, args)
    image_entrypoint = worker(command="null", args='["--config", "/etc/c.toml", "worker", "a:app"]')
    assert lint.lint_text(image_entrypoint, "w.yaml", SETTINGS) == []  # billing:1.4's entrypoint
    corral_image = image_entrypoint.replace("image: billing:1.4", "image: ghcr.io/x/corral:1.2")
    assert one(corral_image).rule == "worker-grace"


def test_other_workloads_are_left_alone() -> None:
    others = [
        '["corral", "dispatcher"]',
        '["celery", "-A", "proj", "worker"]',
        '["sh", "-c", "corral check && corral lint deploy/"]',
        '["python", "-m", "rq", "worker"]',
        '["sh", "-c", "echo \'unclosed"]',
    ]
    for command in others:
        assert lint.lint_text(worker(command=command), "w.yaml", SETTINGS) == [], command
    assert lint.lint_text(worker(kind="Job"), "w.yaml", SETTINGS) == []


def test_other_kinds_that_run_pods_are_checked_too() -> None:
    for kind in ("StatefulSet", "ReplicaSet", "DaemonSet"):
        assert one(worker(kind=kind)).kind == kind
    pod = """\
apiVersion: v1
kind: Pod
metadata: {name: w}
spec:
  terminationGracePeriodSeconds: 20
  containers:
  - {name: sidecar, image: envoy}
  - {name: worker, image: b, command: [corral, worker, "a:app"]}
"""
    found = one(pod)
    assert (found.kind, found.line) == ("Pod", 5)
    assert found.message.startswith("container worker: terminationGracePeriodSeconds 20")


def test_the_drain_annotation_may_declare_a_longer_drain_never_a_shorter_one() -> None:
    longer = one(worker(grace=60, annotations='{corral.dev/drain-seconds: "300"}'))
    assert "not above the drain of 300s (corral.dev/drain-seconds) + margin 5s" in longer.message
    assert "set it to at least 306" in longer.message
    shorter = one(worker(annotations='{corral.dev/drain-seconds: "10"}'))
    assert "drain_timeout 30s + margin 5s: set it to at least 36" in shorter.message
    assert (
        lint.lint_text(
            worker(grace=400, annotations='{corral.dev/drain-seconds: "300"}'), "w.yaml", SETTINGS
        )
        == []
    )
    bad = one(worker(annotations="{corral.dev/drain-seconds: soon}"))
    assert (bad.line, bad.message) == (
        5,
        "corral.dev/drain-seconds 'soon' is not a number of seconds",
    )


def test_a_labelled_worker_gets_worker_grace_instead_of_grace_period() -> None:
    labelled = worker(grace=32).replace(
        "  annotations: {}", "  labels: {corral.dev/component: worker}"
    )
    found = one(labelled)
    assert found.rule == "worker-grace"
    assert one(worker(grace="'${GRACE}'")).message == (
        "terminationGracePeriodSeconds '${GRACE}' is not a number of seconds"
    )
