"""Kubeconfig files for the tests of the fields the client does not implement: one
cluster and one user, whose entries the test chooses (an exec plugin, an auth
provider, or the plain server and token)."""

import os

from twisted.trial.unittest import SynchronousTestCase

CLUSTER = "    server: https://127.0.0.1:6443\n"
USER = "    token: t0ken\n"
EXEC = ("    exec:\n      apiVersion: client.authentication.k8s.io/v1\n"
        "      command: get-token\n      interactiveMode: Never\n")
AUTH_PROVIDER = "    auth-provider:\n      name: oidc\n      config: {id-token: abc}\n"


def kubeconfig_text(cluster: str = CLUSTER, user: str = USER) -> str:
    """A kubeconfig whose one cluster and one user have the entries ``cluster`` and
    ``user`` (YAML lines indented by four)."""
    return ("apiVersion: v1\nkind: Config\ncurrent-context: pool\n"
            "contexts:\n- name: pool\n  context: {cluster: c1, user: u1}\n"
            f"clusters:\n- name: c1\n  cluster:\n{cluster}"
            f"users:\n- name: u1\n  user:\n{user}")


def write_kubeconfig(test: SynchronousTestCase, text: str) -> str:
    """``text`` as a kubeconfig file in a fresh directory of ``test``; its path."""
    directory = os.path.abspath(test.mktemp())
    os.makedirs(directory)
    path = os.path.join(directory, "kubeconfig")
    with open(path, "w") as f:
        f.write(text)
    return path
