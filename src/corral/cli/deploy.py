"""`corral deploy`: the manifests corral needs on a cluster, printed from its settings."""

from __future__ import annotations

import click

from corral.cli.common import State, config_option, out

ROLE_COMMAND = "corral deploy rbac"


@click.group()
def deploy() -> None:
    """Print the manifests corral needs on a cluster."""


@deploy.command("rbac")
@click.option(
    "--executors",
    "kinds",
    help="Comma-separated executor kinds (default: executors.enabled); those without"
    " cluster calls add nothing.",
)
@click.option(
    "--namespace",
    help="corral's own namespace, where its service account is (default:"
    " executors.kubernetes.namespace).",
)
@config_option
@click.pass_obj
def rbac_cmd(state: State, kinds: str | None, namespace: str | None) -> None:
    """The ServiceAccount, Roles and RoleBindings the executors need: exactly the API calls
    they make, in each namespace jobs may run in (executors.kubernetes.namespaces), and
    the Role of the jobs' service accounts where an executor's pods need one (Argo's)."""
    from corral import errors
    from corral.executors import rbac, registry

    settings = state.settings(check_chain=False)
    chosen = [k for k in (kinds.split(",") if kinds else settings.executors.enabled) if k]
    rules = [r() for k in chosen if (r := registry.get(k).rules) is not None]
    if not rules:
        raise errors.InvalidInput(
            f"none of the executors {', '.join(chosen) or '(none)'} calls a cluster: no Role to"
            " print (name them with --executors, e.g. --executors kubernetes,argo)"
        )
    k8s = settings.executors.kubernetes
    docs = rbac.manifests(
        settings, rules, namespace=namespace or k8s.namespace, account=k8s.own_service_account
    )
    command = ROLE_COMMAND + (f" --executors {kinds}" if kinds else "")
    out.print(rbac.render(docs, rules, command), end="", markup=False, soft_wrap=True)
