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
