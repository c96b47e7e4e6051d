"""The cluster executors' libraries are an extra (`corral[kubernetes]`)."""

from __future__ import annotations

import pytest


def test_a_cluster_executor_without_its_libraries_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A plain install (`make run`) leaves the Kubernetes libraries out."""
    import sys

    from corral import config, errors
    from corral.executors import builtin

    monkeypatch.delitem(sys.modules, "corral.executors.kubernetes", raising=False)
    monkeypatch.setitem(sys.modules, "kubernetes_validate", None)
    with pytest.raises(errors.ConfigError, match=r"pip install 'corral\[kubernetes\]'"):
        builtin.KUBERNETES.build(config.Settings(), None)  # type: ignore[arg-type]
