"""``docs/deploying.md``'s step-by-step for a new pool: every command that can run
without a cluster runs here, as written, in a copy of ``deploy/`` (a new pool's overlay,
its certificates, rendering and validation, the overlay's rolling update and rollback);
step 7's checks run against a pool of agents in ``test_poolpki``; each other command
is named with why it cannot run here. A command added to the steps that no test knows
fails the test.
"""

import os
import shutil
import subprocess
import sys

import yaml
from twisted.trial import unittest

from yurtcoord.sim.pki import TestCA
from yurtcoord.testing.deploydoc import POOL_CHECKS, step_by_step_commands
from yurtcoord.testing.kustomize import copy_deploy, schema_problems, the_object

RUNS_HERE = ("cp -r ", "sed -i ", "yurtcoordctl pki ", "kubectl kustomize ",
             "kubernetes-validate ")
CLUSTER = "needs the cluster (the cloud apiserver and the pool's nodes)"
NOT_HERE = {
    "docker build -f deploy/Dockerfile -t registry.internal/yurtcoord:0.1.0 .":
        "no image builder here (the Dockerfile's user, command and constraints are "
        "checked in test_deploy)",
    "docker push registry.internal/yurtcoord:0.1.0": "no registry here",
    "make constraints CONSTRAINTS_PYTHON=python3.12":
        "installs the package into a fresh venv of Python 3.12 from the package index",
    "kubectl label node edge-1 apps.openyurt.io/nodepool=west openyurt.io/is-edge-worker=true":
        CLUSTER,
    "install -d -o 65532 -g 65532 -m 0700 /var/lib/yurtcoord/pki": "on each node, as root",
    "kubectl apply -f west.yaml": CLUSTER,
    "kubectl -n yurt-pool-west rollout status statefulset/yurt-coordinator-etcd --timeout=5m":
        CLUSTER,
    "kubectl -n yurt-pool-west rollout status deployment/yurt-coordinator-apiserver "
    "--timeout=5m": CLUSTER,
    "kubectl -n yurt-pool-west port-forward svc/yurt-coordinator-apiserver 6443:443 &": CLUSTER,
    "kubectl --kubeconfig deploy/pools/west/pki/admin.kubeconfig apply -f "
    "deploy/coordinator/rbac.yaml":
        "the coordinator is a kube-apiserver; the API test server serves no RBAC objects",
    "kubectl -n yurt-pool-west rollout status daemonset/yurtcoord --timeout=5m": CLUSTER,
    "kubectl -n yurt-pool-west get pods -o wide": CLUSTER,
    "kubectl -n yurt-pool-west rollout status daemonset/yurtcoord --timeout=10m": CLUSTER,
    "kubectl -n yurt-pool-west rollout history daemonset/yurtcoord": CLUSTER,
    "kubectl -n yurt-pool-west rollout undo daemonset/yurtcoord": CLUSTER,
    "kubectl -n yurt-pool-west rollout restart statefulset/yurt-coordinator-etcd "
    "deployment/yurt-coordinator-apiserver": CLUSTER,
}


class StepByStepTests(unittest.TestCase):
    """The steps as an operator runs them, from a repository root."""

    def test_every_command_is_run_here_or_said_why_not(self):
        commands = step_by_step_commands()
        known = set(NOT_HERE) | set(POOL_CHECKS)
        # What runs here is what needs no cluster: the overlay, the certificates,
        # rendering and validation. Any other command must be known.
        self.assertEqual([c for c in commands if c not in known
                          and not c.startswith(RUNS_HERE)], [])
        self.assertEqual(sorted(set(POOL_CHECKS) - set(commands)), [])
        self.assertEqual(sorted(set(NOT_HERE) - set(commands)), [])

    def test_the_runnable_steps_make_a_valid_pool(self):
        root = os.path.abspath(self.mktemp())
        os.makedirs(root)
        copy_deploy(root)
        # The cluster CA of step 3: any CA's certificate.
        shutil.copy(TestCA(os.path.join(root, "cluster-ca")).ca_file,
                    os.path.join(root, "cluster-ca.crt"))
        bin_dir = os.path.dirname(sys.executable)
        env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
        known = set(NOT_HERE) | set(POOL_CHECKS)
        images = []
        for command in step_by_step_commands():
            if command in known:
                continue
            done = subprocess.run(["sh", "-c", command], cwd=root, env=env,
                                  capture_output=True, timeout=60, check=False)
            self.assertEqual(done.returncode, 0, f"{command}: {done.stderr!r}")
            if command.startswith("kubectl kustomize "):
                with open(os.path.join(root, "west.yaml"), encoding="utf-8") as f:
                    rendered = [d for d in yaml.safe_load_all(f) if d]
                (agent,) = the_object(rendered, "DaemonSet")["spec"]["template"]["spec"][
                    "containers"]
                images.append(agent["image"])
        # Rendered for the new pool, updated, rolled back.
        self.assertEqual(images, ["registry.internal/yurtcoord:0.1.0",
                                  "registry.internal/yurtcoord:0.1.1",
                                  "registry.internal/yurtcoord:0.1.0"])
        self.assertEqual(schema_problems(rendered), [])
        namespaces = {d["metadata"].get("namespace") for d in rendered}
        self.assertEqual(namespaces, {None, "yurt-pool-west", "kube-system", "kube-node-lease"})
        secrets = {d["metadata"]["name"] for d in rendered if d["kind"] == "Secret"}
        self.assertIn("yurt-coordinator-yurthub-certs", secrets)
        self.assertNotIn("example", yaml.safe_dump_all(rendered))
