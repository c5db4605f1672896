"""The deployment manifests (``deploy/``) as ``kubectl kustomize`` renders each pool
overlay, against the Kubernetes schema and against the agent's configuration.

- Every rendered object passes ``kubernetes-validate`` in strict mode for the pinned
  Kubernetes version, and a misspelt field in a manifest fails it; every object also
  deserializes into the official ``kubernetes`` client's model of its kind and back
  unchanged.
- The pool's name is written once, in the overlay: a copy with another name renders
  that pool everywhere (namespace, selectors, node selectors, RBAC names).
- The ConfigMap's ini is a valid configuration once the DaemonSet's init container
  wrote the node, pool and namespace into it (its shell command runs here, in temp
  dirs), the DaemonSet mounts what that ini names, runs as non-root with a seccomp
  profile and a memory limit, and the Dockerfile starts the agent the way the
  DaemonSet does, as the user the DaemonSet names.
- The pool's coordinator: the flags the agents rely on, the Services and ports the
  agents' ini names, the etcd members' stable names; with the Secrets of
  ``yurtcoordctl pki`` added, every Secret key the workloads read exists and the
  certificates' SANs cover the rendered Service names.
"""

import base64
import json
import os
import re
import subprocess
import sys
import urllib.parse
from typing import Any

import yaml
from cryptography import x509
from kubernetes import client as kube_models
from twisted.trial import unittest

from yurtcoord.agent import poolpki
from yurtcoord.agent.config import parse_config
from yurtcoord.testing.kustomize import (
    RenderError, copy_deploy, name_of, objects, render, schema_problems, the_object)
from yurtcoord.testing.manifests import (
    BASE_DIR, COORDINATOR_DIR, DEPLOY, EXAMPLE_POOL, EXAMPLE_POOL_DIR, KUBERNETES_VERSION,
    POOL_LABEL, documents, for_pool, pool_namespace)

RBAC_KINDS = ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding", "ServiceAccount")


def to_model(api: kube_models.ApiClient, document: dict[str, Any], name: str) -> Any:
    """``document`` deserialized into the client's model class ``name``, as the client
    reads an apiserver's JSON answer."""
    return api.deserialize(json.dumps(document), name, "application/json")


def model_class_name(document: dict[str, Any]) -> str:
    """``V1DaemonSet`` for ``apps/v1`` ``DaemonSet``: the client's model of the kind."""
    version = document["apiVersion"].split("/")[-1]
    return version[0].upper() + version[1:] + document["kind"]


def flags(command: list[str]) -> dict[str, str]:
    """``{--flag: value}`` of a command line of ``--flag=value`` and bare ``--flag``."""
    found = {}
    for argument in command[1:]:
        name, _, value = argument.partition("=")
        found[name] = value
    return found


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def example() -> list[dict[str, Any]]:
    return render(EXAMPLE_POOL_DIR)


def config_text(rendered: list[dict[str, Any]]) -> str:
    return the_object(rendered, "ConfigMap", "yurtcoord")["data"]["yurtcoord.ini"]


def run_init_container(case: unittest.TestCase, rendered: list[dict[str, Any]],
                       node: str) -> str:
    """The ini the DaemonSet's init container writes for a pod of ``node``: its shell
    command run here, with temp dirs in place of its two mounts and the environment
    its fieldRefs give (the pod's node, pool label and namespace); the ini's text."""
    daemonset = the_object(rendered, "DaemonSet")
    (init,) = pod_spec(daemonset)["initContainers"]
    template_mount, config_mount = (m["mountPath"] for m in init["volumeMounts"])
    fields = {"spec.nodeName": node,
              f"metadata.labels['{POOL_LABEL}']":
                  daemonset["spec"]["template"]["metadata"]["labels"][POOL_LABEL],
              "metadata.namespace": daemonset["metadata"]["namespace"]}
    env = {item["name"]: fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
           for item in init["env"]}
    template_dir, config_dir = case.mktemp(), case.mktemp()
    os.makedirs(template_dir)
    os.makedirs(config_dir)
    with open(os.path.join(template_dir, "yurtcoord.ini"), "w", encoding="utf-8") as f:
        f.write(config_text(rendered))
    case.assertEqual(init["command"][:2], ["sh", "-c"])
    script = (init["command"][2].replace(template_mount + "/", template_dir + "/")
              .replace(config_mount + "/", config_dir + "/"))
    subprocess.run(["sh", "-c", script], check=True, timeout=30,
                   env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env})
    with open(os.path.join(config_dir, "yurtcoord.ini"), encoding="utf-8") as f:
        return f.read()


class SchemaTests(unittest.TestCase):
    """Every overlay renders, and each object is valid for the pinned Kubernetes."""

    def test_every_pool_overlay_renders_and_passes_strict_validation(self):
        pools = os.path.join(DEPLOY, "pools")
        overlays = sorted(os.listdir(pools))
        self.assertIn(EXAMPLE_POOL, overlays)
        for overlay in overlays:
            rendered = render(os.path.join(pools, overlay))
            kinds = {d["kind"] for d in rendered}
            self.assertTrue({"Namespace", "DaemonSet", "ConfigMap", "StatefulSet",
                             "Deployment", "Service", "PodDisruptionBudget"} <= kinds, kinds)
            self.assertEqual(schema_problems(rendered), [], overlay)

    def test_the_coordinator_rbac_passes_strict_validation(self):
        self.assertEqual(schema_problems(d for _, d in documents(COORDINATOR_DIR)), [])

    def test_a_misspelt_field_fails_validation(self):
        deploy = copy_deploy(self.mktemp())
        path = os.path.join(deploy, "base", "daemonset.yaml")
        with open(path, encoding="utf-8") as f:
            text = f.read()
        self.assertIn("      hostNetwork: true\n", text)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text.replace("      hostNetwork: true\n", "      hostNetwrok: true\n"))
        problems = schema_problems(render(os.path.join(deploy, "pools", EXAMPLE_POOL)))
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("DaemonSet yurt-pool-example/yurtcoord: spec.template.spec: ", problems[0])
        self.assertIn("'hostNetwrok' was unexpected", problems[0])

    def test_a_broken_overlay_is_a_render_error(self):
        deploy = copy_deploy(self.mktemp())
        overlay = os.path.join(deploy, "pools", EXAMPLE_POOL)
        with open(os.path.join(overlay, "kustomization.yaml"), "a", encoding="utf-8") as f:
            f.write("resources: [../../no-such-base]\n")
        self.assertRaises(RenderError, render, overlay)

    def test_the_pinned_version_is_the_coordinator_apiserver_version(self):
        apiserver = the_object(example(), "Deployment", poolpki.APISERVER_SERVICE)
        (container,) = pod_spec(apiserver)["containers"]
        image, tag = container["image"].rsplit(":", 1)
        self.assertEqual(image, "registry.k8s.io/kube-apiserver")
        self.assertEqual(tag.lstrip("v").split(".")[:2], KUBERNETES_VERSION.split(".")[:2])

    def test_every_object_round_trips_through_its_kubernetes_model(self):
        api = kube_models.ApiClient()
        found = example() + [d for _, d in documents(COORDINATOR_DIR)]
        for document in found:
            name = model_class_name(document)
            self.assertTrue(hasattr(kube_models, name), f"no model {name}")
            model = to_model(api, document, name)
            self.assertEqual(api.sanitize_for_serialization(model), document,
                             f"{name_of(document)} does not survive its model")


class PoolOverlayTests(unittest.TestCase):
    """The pool's name is set once, in its overlay."""

    def test_another_pool_is_the_example_with_its_name_changed_once(self):
        deploy = copy_deploy(self.mktemp())
        west = os.path.join(deploy, "pools", "west")
        os.rename(os.path.join(deploy, "pools", EXAMPLE_POOL), west)
        path = os.path.join(west, "kustomization.yaml")
        with open(path, encoding="utf-8") as f:
            text = f.read()
        line = f"      {POOL_LABEL}: {EXAMPLE_POOL}\n"
        # Once, comments aside.
        settings = [item for item in text.splitlines(keepends=True)
                    if not item.lstrip().startswith("#")]
        self.assertEqual([item for item in settings if EXAMPLE_POOL in item], [line])
        with open(path, "w", encoding="utf-8") as f:
            f.write(text.replace(line, f"      {POOL_LABEL}: west\n"))
        rendered = render(west)
        self.assertNotIn(EXAMPLE_POOL, yaml.safe_dump_all(rendered))
        self.assertNotIn("POOL", yaml.safe_dump_all(rendered).replace("@POOL@", "")
                         .replace("${POOL}", "").replace("name: POOL", ""))
        self.assertEqual(the_object(rendered, "Namespace")["metadata"]["name"],
                         "yurt-pool-west")
        for document in rendered:
            metadata = document["metadata"]
            self.assertEqual(metadata["labels"][POOL_LABEL], "west", name_of(document))
            if document["kind"] in ("DaemonSet", "StatefulSet", "Deployment"):
                self.assertEqual(pod_spec(document)["nodeSelector"][POOL_LABEL], "west")
                self.assertEqual(document["spec"]["selector"]["matchLabels"][POOL_LABEL],
                                 "west")
                self.assertEqual(metadata["namespace"], "yurt-pool-west")
        self.assertEqual(schema_problems(rendered), [])

    def test_the_overlay_names_the_base_as_for_pool_does(self):
        """The unit tier reads the RBAC through ``for_pool``: it gives what the
        overlay renders, labels aside."""
        rendered = {name_of(d): d for d in example() if d["kind"] in RBAC_KINDS}
        expected = {}
        for _, document in documents(BASE_DIR):
            if document["kind"] in RBAC_KINDS:
                named = for_pool(document)
                expected[name_of(named)] = named
        self.assertEqual(sorted(rendered), sorted(expected))
        for name, document in rendered.items():
            document["metadata"].pop("labels")
            self.assertEqual(document, expected[name], name)


class AgentTests(unittest.TestCase):
    """The DaemonSet and its ConfigMap agree, and the pod is hardened."""

    def setUp(self):
        self.rendered = example()
        self.daemonset = the_object(self.rendered, "DaemonSet")
        self.pod = pod_spec(self.daemonset)

    def config(self):
        text = run_init_container(self, self.rendered, "edge-7")
        return parse_config(text, "configmap")

    def test_the_init_container_writes_node_pool_and_namespace_into_the_ini(self):
        config = self.config()
        self.assertEqual((config.node.name, config.node.pool), ("edge-7", EXAMPLE_POOL))
        self.assertEqual(config.coordinator.secret_namespace, pool_namespace(EXAMPLE_POOL))
        self.assertEqual(config.cloud.token_file,
                         "/var/run/secrets/kubernetes.io/serviceaccount/token")

    def test_the_daemonset_runs_the_agent_with_what_its_ini_names(self):
        config = self.config()
        pod = self.pod
        (agent,) = pod["containers"]
        (init,) = pod["initContainers"]
        command = agent["command"]
        self.assertEqual([command[0], command[1]], ["twistd", "-n"])
        config_path = command[command.index("--config") + 1]
        self.assertEqual(config_path, "/etc/yurtcoord/yurtcoord.ini")
        self.assertTrue(pod["hostNetwork"])
        self.assertEqual(pod["serviceAccountName"],
                         the_object(self.rendered, "ServiceAccount")["metadata"]["name"])
        volumes = {v["name"]: v for v in pod["volumes"]}
        self.assertEqual(volumes["config-template"]["configMap"]["name"],
                         the_object(self.rendered, "ConfigMap")["metadata"]["name"])
        mounts = {m["mountPath"]: m for m in agent["volumeMounts"]}
        self.assertIn(config_path, " ".join(init["command"]))
        self.assertIn(os.path.dirname(config_path), mounts)
        self.assertFalse(mounts[config.coordinator.pki_dir].get("readOnly", False))
        # The node's certificate: its directory from the host, read-only.
        kubelet_pki = os.path.dirname(config.node.kubelet_client_cert)
        self.assertEqual(config.node.kubelet_client_cert,
                         "/var/lib/kubelet/pki/kubelet-client-current.pem")
        self.assertTrue(mounts[kubelet_pki]["readOnly"])
        self.assertEqual(volumes[mounts[kubelet_pki]["name"]]["hostPath"]["path"], kubelet_pki)
        self.assertEqual(volumes[mounts[config.pool_cache.local_cache_dir]["name"]]
                         ["hostPath"]["path"], "/etc/kubernetes/cache")
        # Writable: only the pki dir and yurthub's cache (component-key-cache).
        writable = {path for path, m in mounts.items() if not m.get("readOnly", False)}
        self.assertEqual(writable, {config.coordinator.pki_dir,
                                    config.pool_cache.local_cache_dir})
        probe = agent["readinessProbe"]["httpGet"]
        self.assertEqual((probe["host"], probe["port"], probe["path"]),
                         (config.server.listen.host, config.server.listen.port, "/readyz"))
        self.assertEqual(pod["nodeSelector"][POOL_LABEL], config.node.pool)

    def test_every_container_runs_as_non_root_with_seccomp_and_a_memory_limit(self):
        security = self.pod["securityContext"]
        self.assertTrue(security["runAsNonRoot"])
        self.assertNotEqual(security["runAsUser"], 0)
        self.assertEqual(security["seccompProfile"], {"type": "RuntimeDefault"})
        for workload in objects(self.rendered, "DaemonSet") + objects(
                self.rendered, "StatefulSet") + objects(self.rendered, "Deployment"):
            pod = pod_spec(workload)
            self.assertTrue(pod["securityContext"]["runAsNonRoot"], name_of(workload))
            self.assertEqual(pod["securityContext"]["seccompProfile"]["type"],
                             "RuntimeDefault")
            for container in pod.get("initContainers", []) + pod["containers"]:
                where = f"{name_of(workload)} {container['name']}"
                context = container["securityContext"]
                self.assertIs(context["allowPrivilegeEscalation"], False, where)
                self.assertIs(context["readOnlyRootFilesystem"], True, where)
                self.assertEqual(context["capabilities"], {"drop": ["ALL"]}, where)
                self.assertNotEqual(context.get("runAsUser"), 0, where)
                self.assertIn("memory", container["resources"]["limits"], where)
        (agent,) = self.pod["containers"]
        self.assertEqual(agent["resources"]["limits"]["memory"], "192Mi")
        self.assertEqual(agent["resources"]["requests"]["memory"], "96Mi")

    def test_the_dockerfile_starts_the_agent_the_way_the_daemonset_does(self):
        with open(os.path.join(DEPLOY, "Dockerfile"), encoding="utf-8") as f:
            lines = [line.strip() for line in f if line.strip() and not line.startswith("#")]
        self.assertTrue(lines[0].startswith("FROM python:") and lines[0].endswith("-slim"),
                        lines[0])
        (cmd,) = [line for line in lines if line.startswith("CMD ")]
        (agent,) = self.pod["containers"]
        self.assertEqual(json.loads(cmd[4:]), agent["command"])
        (user,) = [line for line in lines if line.startswith("USER ")]
        self.assertEqual(user.split()[1], f"{self.pod['securityContext']['runAsUser']}:"
                                          f"{self.pod['securityContext']['runAsGroup']}")
        self.assertIn("-c deploy/constraints.txt", " ".join(lines))

    def test_the_constraints_pin_every_dependency_of_the_package(self):
        """``deploy/constraints.txt`` (``make constraints``) pins one exact version of
        each package the agent requires: a dependency added to setup.py without
        regenerating it fails here."""
        def normal(name: str) -> str:
            return re.sub(r"[-_.]+", "-", name).lower()

        with open(os.path.join(DEPLOY, "constraints.txt"), encoding="utf-8") as f:
            pins = dict(line.strip().split("==", 1) for line in f
                        if line.strip() and not line.startswith("#"))
        pinned = {normal(name) for name in pins}
        self.assertTrue(all(re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", v) for v in pins.values()),
                        pins)
        with open(os.path.join(os.path.dirname(DEPLOY), "setup.py"), encoding="utf-8") as f:
            setup = f.read()
        required = re.search(r"install_requires=\[\n(.*?)\n *\],", setup, re.S).group(1)
        names = [normal(re.match(r"[A-Za-z0-9_.-]+", item).group())
                 for item in re.findall(r'"([^"]+)"', required)]
        self.assertGreaterEqual(len(names), 5)
        self.assertEqual([name for name in names if name not in pinned], [])


def add_pki(case: unittest.TestCase, *extra: str) -> tuple[str, str]:
    """A copy of ``deploy/`` whose example pool includes the Secrets of a ``yurtcoordctl
    pki`` run (the installed command, as an operator runs it): the overlay's path and
    the pki directory."""
    deploy = copy_deploy(case.mktemp())
    overlay = os.path.join(deploy, "pools", EXAMPLE_POOL)
    pki = os.path.join(overlay, "pki")
    ctl = os.path.join(os.path.dirname(sys.executable), "yurtcoordctl")
    done = subprocess.run([ctl, "pki", "--pool", EXAMPLE_POOL, "--out", pki, *extra],
                          capture_output=True, timeout=60, check=False)
    case.assertEqual(done.returncode, 0, done.stderr)
    path = os.path.join(overlay, "kustomization.yaml")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    with open(path, "w", encoding="utf-8") as f:
        f.write(text.replace("  - ../../base\n", "  - ../../base\n  - pki\n", 1))
    return overlay, pki


def secret_for_path(rendered: list[dict[str, Any]], workload: dict[str, Any],
                    container: dict[str, Any], path: str) -> bytes:
    """The content of file ``path`` in ``container``: the key of the Secret mounted on
    its directory, from the rendered Secrets (a KeyError when the Secret has no such
    key)."""
    volumes = {v["name"]: v for v in pod_spec(workload)["volumes"]}
    for mount in container["volumeMounts"]:
        secret = volumes.get(mount["name"], {}).get("secret")
        if secret is not None and path.startswith(mount["mountPath"] + "/"):
            data = the_object(rendered, "Secret", secret["secretName"])["data"]
            return base64.b64decode(data[path[len(mount["mountPath"]) + 1:]])
    raise AssertionError(f"{name_of(workload)}: no Secret mounted for {path}")


def san_names(pem: bytes) -> list[str]:
    cert = x509.load_pem_x509_certificate(pem)
    return cert.extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)


class CoordinatorTests(unittest.TestCase):
    """The pool's coordinator as the agents rely on it."""

    def setUp(self):
        self.rendered = example()
        self.namespace = pool_namespace(EXAMPLE_POOL)
        self.config = parse_config(run_init_container(self, self.rendered, "edge-1"), "ini")
        self.apiserver = the_object(self.rendered, "Deployment", poolpki.APISERVER_SERVICE)
        self.etcd = the_object(self.rendered, "StatefulSet", poolpki.ETCD_STATEFULSET)

    def services(self) -> dict[str, dict[str, Any]]:
        return {s["metadata"]["name"]: s for s in objects(self.rendered, "Service")}

    def test_the_apiserver_has_every_flag_the_agents_rely_on(self):
        self.assertEqual(self.apiserver["spec"]["replicas"], 2)
        (container,) = pod_spec(self.apiserver)["containers"]
        found = flags(container["command"])
        self.assertEqual(found["--etcd-prefix"], self.config.coordinator.storage_prefix)
        self.assertEqual(found["--authorization-mode"].split(","), ["Node", "RBAC"])
        self.assertIn("NodeRestriction", found["--enable-admission-plugins"].split(","))
        disabled = found.get("--disable-admission-plugins", "").split(",")
        self.assertFalse({"NodeRestriction", "NamespaceLifecycle", "ServiceAccount"}
                         & set(disabled), disabled)
        for flag in ("--client-ca-file", "--tls-cert-file", "--tls-private-key-file",
                     "--etcd-cafile", "--etcd-certfile", "--etcd-keyfile",
                     "--service-account-key-file", "--service-account-signing-key-file"):
            self.assertTrue(found[flag].startswith("/"), flag)
        served = dict(item.split("=") for item in found["--runtime-config"].split(","))
        self.assertEqual(served.pop("api/all"), "false")
        self.assertEqual(set(served.values()), {"true"})
        self.assertTrue({"api/v1", "coordination.k8s.io/v1", "discovery.k8s.io/v1",
                         "rbac.authorization.k8s.io/v1"} <= set(served), served)
        # The agents and the apiserver use the same etcd members.
        self.assertEqual(found["--etcd-servers"].split(","),
                         list(self.config.coordinator.storage))
        (port,) = container["ports"]
        self.assertEqual(str(port["containerPort"]), found["--secure-port"])

    def test_the_services_and_ports_are_those_the_agents_ini_names(self):
        services = self.services()
        (server,) = self.config.coordinator.server
        url = urllib.parse.urlsplit(server)
        service = services[url.hostname]
        (port,) = service["spec"]["ports"]
        self.assertEqual(port["port"], url.port)
        (container,) = pod_spec(self.apiserver)["containers"]
        (container_port,) = container["ports"]
        self.assertEqual(port["targetPort"], container_port["name"])
        self.assertEqual(service["spec"]["selector"],
                         self.apiserver["spec"]["selector"]["matchLabels"])
        peers = services[self.etcd["spec"]["serviceName"]]
        self.assertEqual(peers["spec"]["clusterIP"], "None")
        self.assertEqual(peers["spec"]["selector"], self.etcd["spec"]["selector"]["matchLabels"])
        members = [f"{self.etcd['metadata']['name']}-{i}.{peers['metadata']['name']}"
                   for i in range(self.etcd["spec"]["replicas"])]
        storage = [urllib.parse.urlsplit(url) for url in self.config.coordinator.storage]
        self.assertEqual([u.hostname for u in storage], members)
        client_ports = {p["port"] for p in peers["spec"]["ports"] if p["name"] == "client"}
        self.assertEqual({u.port for u in storage}, client_ports)

    def test_the_etcd_cluster_names_its_members_by_their_stable_names(self):
        self.assertEqual(self.etcd["spec"]["replicas"], poolpki.ETCD_MEMBERS)
        (container,) = pod_spec(self.etcd)["containers"]
        found = flags(container["command"])
        self.assertIn("--client-cert-auth", found)
        self.assertIn("--peer-client-cert-auth", found)
        cluster = dict(item.split("=", 1) for item in found["--initial-cluster"].split(","))
        self.assertEqual(sorted(cluster), [poolpki.etcd_member(i) for i in range(3)])
        for member, url in cluster.items():
            host = urllib.parse.urlsplit(url.replace("$(POD_NAMESPACE)", self.namespace))
            self.assertEqual(host.hostname, f"{member}.{poolpki.ETCD_PEER_SERVICE}."
                                            f"{self.namespace}.svc")
        budget = the_object(self.rendered, "PodDisruptionBudget", poolpki.ETCD_STATEFULSET)
        self.assertEqual(budget["spec"]["maxUnavailable"], 1)
        self.assertEqual(budget["spec"]["selector"], self.etcd["spec"]["selector"])
        (term,) = (pod_spec(self.etcd)["affinity"]["podAntiAffinity"]
                   ["requiredDuringSchedulingIgnoredDuringExecution"])
        self.assertEqual(term["topologyKey"], "kubernetes.io/hostname")
        self.assertEqual(term["labelSelector"]["matchLabels"],
                         self.etcd["spec"]["selector"]["matchLabels"])
        self.assertEqual(pod_spec(self.etcd)["nodeSelector"], {POOL_LABEL: EXAMPLE_POOL})

    def test_the_pki_secrets_hold_every_file_the_workloads_read_and_their_sans(self):
        overlay, _ = add_pki(self)
        rendered = render(overlay)
        self.assertEqual(schema_problems(rendered), [])
        for secret in objects(rendered, "Secret"):
            self.assertEqual(secret["metadata"]["namespace"], self.namespace)
        # Every file a flag names is a key of the Secret mounted there.
        apiserver = the_object(rendered, "Deployment", poolpki.APISERVER_SERVICE)
        etcd = the_object(rendered, "StatefulSet", poolpki.ETCD_STATEFULSET)
        contents = {}
        for workload in (apiserver, etcd):
            (container,) = pod_spec(workload)["containers"]
            for flag, value in flags(container["command"]).items():
                if value.startswith("/etc/"):
                    contents[flag] = secret_for_path(rendered, workload, container, value)
        # The certificates cover every name the Services are reached by, and each
        # etcd member's stable name.
        for service in objects(rendered, "Service"):
            name = service["metadata"]["name"]
            cert = contents["--tls-cert-file"] if name == poolpki.APISERVER_SERVICE \
                else contents["--cert-file"]
            if service["spec"].get("clusterIP") == "None":
                continue
            for dns in poolpki.service_names(name, self.namespace):
                self.assertIn(dns, san_names(cert), name)
        for index in range(3):
            member = f"{poolpki.etcd_member(index)}.{poolpki.ETCD_PEER_SERVICE}"
            for dns in poolpki.service_names(member, self.namespace):
                self.assertIn(dns, san_names(contents["--cert-file"]))
                self.assertIn(dns, san_names(contents["--peer-cert-file"]))
        # The agents' certs Secret has the keys the agent reads.
        certs = the_object(rendered, "Secret", "yurt-coordinator-yurthub-certs")
        self.assertEqual(sorted(certs["data"]), sorted([
            "ca.crt", "yurt-coordinator-yurthub-client.crt",
            "yurt-coordinator-yurthub-client.key", "node-lease-proxy-client.crt",
            "node-lease-proxy-client.key"]))
