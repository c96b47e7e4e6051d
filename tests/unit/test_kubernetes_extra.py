"""The cluster executors' libraries are an extra (`corral[kubernetes]`)."""

from __future__ import annotations

import pytest


def test_a_cluster_executor_without_its_libraries_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A plain install (`make run`) leaves the Kubernetes libraries out."""
    import sys

    from corral import config, errors, executors
    from corral.executors import builtin

    # Its modules are imported afresh, as in an install without the libraries.
    for module in ("kubernetes", "kubernetes_manifest"):
        monkeypatch.delitem(sys.modules, f"corral.executors.{module}", raising=False)
        monkeypatch.delattr(executors, module, raising=False)
    monkeypatch.setitem(sys.modules, "kubernetes_validate", None)
    with pytest.raises(errors.ConfigError, match=r"pip install 'corral\[kubernetes\]'"):
        builtin.KUBERNETES.build(config.Settings(), None)  # type: ignore[arg-type]
