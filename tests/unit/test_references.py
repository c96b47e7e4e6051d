"""Every object a cluster spec names, as the kubelet would read it: the walk over a
normalised spec, for the ways the API test does not submit (volume types whose Secret is
a `secretRef`, `nodePublishSecretRef` or `secretName` of their own)."""

from __future__ import annotations

from corral.executors import references
from corral.executors.references import Reference


def test_volume_types_that_name_a_secret_of_their_own_are_read() -> None:
    spec = {
        "volumes": [
            {"name": "a", "csi": {"driver": "x", "nodePublishSecretRef": {"name": "s1"}}},
            {"name": "b", "cephfs": {"monitors": ["m"], "secretRef": {"name": "s2"}}},
            {"name": "c", "azureFile": {"secretName": "s3", "shareName": "x"}},
            {"name": "d", "emptyDir": {}},
        ]
    }
    assert list(references.references(spec)) == [
        Reference("volumes[0].csi.nodePublishSecretRef.name", "secret", "s1"),
        Reference("volumes[1].cephfs.secretRef.name", "secret", "s2"),
        Reference("volumes[2].azureFile.secretName", "secret", "s3"),
    ]


def test_a_spec_that_names_nothing_names_nothing() -> None:
    assert list(references.references({"image": "busybox", "command": ["true"]})) == []
