"""Kubeconfig fields that would change how the client authenticates or verifies the
server, but that the client does not implement, are errors of the loader naming the
file and the field; empty values mean unset, and fields of the wrong type are errors,
not crashes."""

from twisted.trial import unittest

from yurtcoord.kube.kubeconfig import (
    UNSUPPORTED_CLUSTER_FIELDS, UNSUPPORTED_USER_FIELDS, KubeconfigError, load_kubeconfig,
)
from yurtcoord.testing.kubeconfigs import (
    AUTH_PROVIDER, CLUSTER, EXEC, USER, kubeconfig_text, write_kubeconfig,
)


class LoaderTests(unittest.TestCase):
    def write(self, text):
        return write_kubeconfig(self, text)

    def assertRejected(self, text, field, advice):
        path = self.write(text)
        with self.assertRaises(KubeconfigError) as caught:
            load_kubeconfig(path)
        message = str(caught.exception)
        self.assertEqual(message.splitlines(), [message])
        self.assertTrue(message.startswith(f"{path}: "), message)
        self.assertIn(field, message)
        self.assertIn(advice, message)
        self.assertNotIn("t0ken", message)
        self.assertNotIn("abc", message)
        return message

    def test_exec_auth_provider_and_tls_server_name_are_rejected_naming_the_field(self):
        self.assertRejected(kubeconfig_text(user=USER + EXEC),
                            "users[name=u1].user.exec", "credential plugins are not supported")
        self.assertRejected(kubeconfig_text(user=AUTH_PROVIDER),
                            "users[name=u1].user.auth-provider", "client certificate")
        self.assertRejected(kubeconfig_text(cluster=CLUSTER + "    tls-server-name: api.x\n"),
                            "clusters[name=c1].cluster.tls-server-name",
                            "server certificate carries")

    def test_every_other_unsupported_field_is_rejected(self):
        for name in UNSUPPORTED_USER_FIELDS:
            with self.subTest(field=name):
                value = "[g1]" if name == "as-groups" else (
                    "{k: [v]}" if name == "as-user-extra" else "x")
                self.assertRejected(kubeconfig_text(user=f"{USER}    {name}: {value}\n"),
                                    f"users[name=u1].user.{name}", "not supported")
        for name in UNSUPPORTED_CLUSTER_FIELDS:
            with self.subTest(field=name):
                self.assertRejected(kubeconfig_text(cluster=f"{CLUSTER}    {name}: x\n"),
                                    f"clusters[name=c1].cluster.{name}", "not supported")

    def test_empty_values_mean_unset_as_in_the_format(self):
        creds = load_kubeconfig(self.write(kubeconfig_text(
            cluster=CLUSTER + "    tls-server-name: ''\n    proxy-url:\n",
            user=USER + "    exec: null\n    as-groups: []\n")))
        self.assertEqual(creds.token, "t0ken")
        self.assertEqual(creds.server, "https://127.0.0.1:6443")

    def test_fields_of_the_wrong_type_are_errors_not_crashes(self):
        cases = {
            "token list": (kubeconfig_text(user="    token: [a]\n"), "user.token must be a string"),
            "quoted false": (kubeconfig_text(
                cluster=CLUSTER + "    insecure-skip-tls-verify: 'false'\n"),
                "insecure-skip-tls-verify must be true or false"),
            "server number": (kubeconfig_text(cluster="    server: 5\n"),
                              "cluster.server must be a string"),
            "ca mapping": (kubeconfig_text(cluster=CLUSTER + "    certificate-authority: {a: 1}\n"),
                           "certificate-authority must be a string"),
            "data list": (kubeconfig_text(user="    client-key-data: [1]\n"),
                          "client-key-data must be a base64 string"),
            "users mapping": (kubeconfig_text().replace(
                "users:\n- name: u1\n  user:\n    token: t0ken\n", "users: {u1: x}\n"),
                "users must be a list"),
            "user string": (kubeconfig_text().replace("  user:\n    token: t0ken\n", "  user: x\n"),
                            "users[name=u1].user must be a mapping"),
            "contexts of strings": ("contexts: [a]\nclusters: []\n", "no current-context set"),
        }
        for name, (text, expected) in cases.items():
            with self.subTest(case=name):
                path = self.write(text)
                with self.assertRaises(KubeconfigError) as caught:
                    load_kubeconfig(path)
                self.assertIn(expected, str(caught.exception))
                self.assertTrue(str(caught.exception).startswith(path))


class CredentialsTests(unittest.TestCase):
    """A cluster server URL with credentials is refused with them masked; a cluster's
    ``insecure-skip-tls-verify: true`` is refused where the caller does not allow it
    (the agent allows it only with ``[cloud] insecure = true``)."""

    INSECURE = CLUSTER + "    insecure-skip-tls-verify: true\n"

    def test_credentials_in_the_server_url_are_refused_and_masked(self):
        path = write_kubeconfig(self, kubeconfig_text(
            cluster="    server: https://admin:S3cret@127.0.0.1:6443\n"))
        with self.assertRaises(KubeconfigError) as caught:
            load_kubeconfig(path)
        message = str(caught.exception)
        self.assertEqual(message.splitlines(), [message])
        self.assertTrue(message.startswith(
            f"{path}: clusters[name=c1].cluster.server 'https://***@127.0.0.1:6443' carries "
            "credentials"), message)
        self.assertNotIn("S3cret", message)
        self.assertNotIn("admin", message)

    def test_insecure_skip_tls_verify_is_refused_unless_allowed(self):
        path = write_kubeconfig(self, kubeconfig_text(cluster=self.INSECURE))
        with self.assertRaises(KubeconfigError) as caught:
            load_kubeconfig(path, allow_insecure=False)
        message = str(caught.exception)
        self.assertEqual(message.splitlines(), [message])
        self.assertTrue(message.startswith(
            f"{path}: clusters[name=c1].cluster.insecure-skip-tls-verify is true"), message)
        self.assertIn("[cloud] insecure = true", message)
        self.assertNotIn("t0ken", message)
        self.assertTrue(load_kubeconfig(path, allow_insecure=True).insecure)

    def test_a_verifying_cluster_is_accepted_either_way(self):
        path = write_kubeconfig(self, kubeconfig_text(
            cluster=CLUSTER + "    insecure-skip-tls-verify: false\n"))
        self.assertFalse(load_kubeconfig(path, allow_insecure=False).insecure)
