"""The deployment manifests (``deploy/``) parse and agree with the agent's
configuration.

- Every YAML document deserializes into the official ``kubernetes`` client's model of
  its kind and serializes back to the same document (a misspelt or misplaced field is
  dropped by the model, so the round trip shows it).
- The ConfigMap's ini is a valid configuration once the DaemonSet's init container
  wrote the node name into it (its shell command runs here, in temp dirs), the
  DaemonSet mounts what that ini names, and the Dockerfile starts the agent the way the
  DaemonSet does.
"""

import json
import os
import subprocess
from typing import Any

from kubernetes import client as kube_models
from twisted.trial import unittest

from yurtcoord.agent.config import parse_config
from yurtcoord.testing.manifests import CLOUD_DIR, COORDINATOR_DIR, DEPLOY, documents, the

NODE_NAME_PLACEHOLDER = "@NODE_NAME@"


def to_model(api: kube_models.ApiClient, document: dict[str, Any], name: str) -> Any:
    """``document`` deserialized into the client's model class ``name``, as the client
    reads an apiserver's JSON answer."""
    return api.deserialize(json.dumps(document), name, "application/json")


def model_class_name(document: dict[str, Any]) -> str:
    """``V1DaemonSet`` for ``apps/v1`` ``DaemonSet``: the client's model of the kind."""
    version = document["apiVersion"].split("/")[-1]
    return version[0].upper() + version[1:] + document["kind"]


class ManifestTests(unittest.TestCase):
    """Each document is a valid object of its kind, and the parts agree."""

    def test_every_document_round_trips_through_its_kubernetes_model(self):
        api = kube_models.ApiClient()
        found = documents(CLOUD_DIR) + documents(COORDINATOR_DIR)
        self.assertGreaterEqual(len(found), 12)
        for path, document in found:
            name = model_class_name(document)
            self.assertTrue(hasattr(kube_models, name), f"{path}: no model {name}")
            model = to_model(api, document, name)
            self.assertIsInstance(model, getattr(kube_models, name))
            self.assertEqual(api.sanitize_for_serialization(model), document,
                             f"{path}: {document['kind']} {document['metadata']['name']} "
                             "does not survive its model (a field the model does not know?)")

    def test_the_round_trip_catches_a_misplaced_field(self):
        api = kube_models.ApiClient()
        daemonset = the("DaemonSet")
        daemonset["spec"]["template"]["spec"]["hostNetwrok"] = True
        model = to_model(api, daemonset, "V1DaemonSet")
        self.assertNotEqual(api.sanitize_for_serialization(model), daemonset)

    def config_text(self) -> str:
        return the("ConfigMap")["data"]["yurtcoord.ini"]

    def test_the_configmap_ini_is_a_valid_configuration_for_a_node(self):
        text = self.config_text()
        self.assertIn(NODE_NAME_PLACEHOLDER, text)
        config = parse_config(text.replace(NODE_NAME_PLACEHOLDER, "edge-7"), "configmap")
        self.assertEqual(config.node.name, "edge-7")
        self.assertEqual(config.cloud.token_file,
                         "/var/run/secrets/kubernetes.io/serviceaccount/token")

    def test_the_daemonset_runs_the_agent_with_what_its_ini_names(self):
        config = parse_config(self.config_text().replace(NODE_NAME_PLACEHOLDER, "edge-7"),
                              "configmap")
        daemonset, configmap = the("DaemonSet"), the("ConfigMap")
        pod = daemonset["spec"]["template"]["spec"]
        (agent,) = pod["containers"]
        (init,) = pod["initContainers"]
        command = agent["command"]
        self.assertEqual([command[0], command[1]], ["twistd", "-n"])
        config_path = command[command.index("--config") + 1]
        self.assertEqual(config_path, "/etc/yurtcoord/yurtcoord.ini")
        self.assertTrue(pod["hostNetwork"])
        self.assertEqual(pod["serviceAccountName"], the("ServiceAccount")["metadata"]["name"])
        volumes = {v["name"]: v for v in pod["volumes"]}
        self.assertEqual(volumes["config-template"]["configMap"]["name"],
                         configmap["metadata"]["name"])
        mounts = {m["mountPath"]: m for m in agent["volumeMounts"]}
        # The init container writes the ini where the agent reads it.
        self.assertIn(config_path, " ".join(init["command"]))
        self.assertIn(os.path.dirname(config_path), mounts)
        self.assertIn(config.coordinator.pki_dir, mounts)
        self.assertFalse(mounts[config.coordinator.pki_dir].get("readOnly", False))
        self.assertIn(config.pool_cache.local_cache_dir, mounts)
        self.assertEqual(volumes[mounts[config.pool_cache.local_cache_dir]["name"]]
                         ["hostPath"]["path"], "/etc/kubernetes/cache")
        probe = agent["readinessProbe"]["httpGet"]
        self.assertEqual((probe["host"], probe["port"], probe["path"]),
                         (config.server.listen.host, config.server.listen.port, "/readyz"))
        requests = agent["resources"]["requests"]
        self.assertEqual(set(requests), {"cpu", "memory"})
        # Pods of the DaemonSet are those of the ConfigMap's pool.
        pool_label = "apps.openyurt.io/nodepool"
        self.assertEqual(pod["nodeSelector"][pool_label], config.node.pool)

    def test_the_init_container_writes_the_node_name_into_the_ini(self):
        pod = the("DaemonSet")["spec"]["template"]["spec"]
        (init,) = pod["initContainers"]
        (node_name,) = init["env"]
        self.assertEqual(node_name["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName")
        template_mount, config_mount = (m["mountPath"] for m in init["volumeMounts"])
        # Its shell command, run here with temp dirs in place of its two mounts.
        template_dir, config_dir = self.mktemp(), self.mktemp()
        os.makedirs(template_dir)
        os.makedirs(config_dir)
        with open(os.path.join(template_dir, "yurtcoord.ini"), "w", encoding="utf-8") as f:
            f.write(self.config_text())
        self.assertEqual(init["command"][:2], ["sh", "-c"])
        script = (init["command"][2].replace(template_mount + "/", template_dir + "/")
                  .replace(config_mount + "/", config_dir + "/"))
        subprocess.run(["sh", "-c", script], check=True, timeout=30,
                       env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                            node_name["name"]: "edge-7"})
        written = os.path.join(config_dir, "yurtcoord.ini")
        with open(written, encoding="utf-8") as f:
            config = parse_config(f.read(), written)
        self.assertEqual((config.node.name, config.node.pool), ("edge-7", "pool-a"))

    def test_the_dockerfile_starts_the_agent_the_way_the_daemonset_does(self):
        with open(os.path.join(DEPLOY, "Dockerfile"), encoding="utf-8") as f:
            lines = [line.strip() for line in f if line.strip() and not line.startswith("#")]
        self.assertTrue(lines[0].startswith("FROM python:") and lines[0].endswith("-slim"),
                        lines[0])
        (cmd,) = [line for line in lines if line.startswith("CMD ")]
        self.assertEqual(json.loads(cmd[4:]), the("DaemonSet")["spec"]["template"]["spec"]
                         ["containers"][0]["command"])
