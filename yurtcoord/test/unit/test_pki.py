"""The test PKI's certificates carry what a strict X.509 verifier looks for.

Python 3.13's ``ssl`` verifies with ``VERIFY_X509_STRICT`` by default, and so do the
``kubernetes`` client and the etcd fixture's health check built on it. These tests
read back from the PEM files, certificate by certificate, the extensions RFC 5280
asks for; the handshakes under a strict verifier are in the integration tier.
"""

import os

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from twisted.trial import unittest

from yurtcoord.sim.pki import TestCA, read_pem


def _ext(cert, cls):
    return cert.extensions.get_extension_for_class(cls)


class CertificateExtensionTests(unittest.TestCase):
    """What RFC 5280 asks of each certificate, read back from the PEM files."""

    def setUp(self):
        self.ca = TestCA(os.path.abspath(self.mktemp()))
        self.ca_cert = x509.load_pem_x509_certificate(read_pem(self.ca.ca_file))
        self.server = x509.load_pem_x509_certificate(
            read_pem(self.ca.server_pair("server").cert_file))
        self.client = x509.load_pem_x509_certificate(
            read_pem(self.ca.client_pair("client", "admin",
                                         ["system:masters", "team-a"]).cert_file))

    def test_subject_key_identifiers(self):
        for cert in (self.ca_cert, self.server, self.client):
            ski = _ext(cert, x509.SubjectKeyIdentifier)
            self.assertFalse(ski.critical)
            self.assertEqual(ski.value,
                             x509.SubjectKeyIdentifier.from_public_key(cert.public_key()))

    def test_authority_key_identifier_names_the_ca(self):
        ca_ski = _ext(self.ca_cert, x509.SubjectKeyIdentifier).value
        for cert in (self.ca_cert, self.server, self.client):
            aki = _ext(cert, x509.AuthorityKeyIdentifier)
            self.assertFalse(aki.critical)
            self.assertEqual(aki.value.key_identifier, ca_ski.digest)

    def test_ca_constraints_and_usage(self):
        constraints = _ext(self.ca_cert, x509.BasicConstraints)
        self.assertTrue(constraints.critical)
        self.assertTrue(constraints.value.ca)
        usage = _ext(self.ca_cert, x509.KeyUsage)
        self.assertTrue(usage.critical)
        self.assertTrue(usage.value.key_cert_sign)
        self.assertTrue(usage.value.crl_sign)
        with self.assertRaises(x509.ExtensionNotFound):
            _ext(self.ca_cert, x509.ExtendedKeyUsage)

    def test_leaf_constraints_and_usages(self):
        for cert, purposes in ((self.server, [ExtendedKeyUsageOID.SERVER_AUTH,
                                              ExtendedKeyUsageOID.CLIENT_AUTH]),
                               (self.client, [ExtendedKeyUsageOID.CLIENT_AUTH])):
            constraints = _ext(cert, x509.BasicConstraints)
            self.assertTrue(constraints.critical)
            self.assertFalse(constraints.value.ca)
            usage = _ext(cert, x509.KeyUsage)
            self.assertTrue(usage.critical)
            self.assertTrue(usage.value.digital_signature)
            self.assertFalse(usage.value.key_cert_sign)
            self.assertEqual(list(_ext(cert, x509.ExtendedKeyUsage).value), purposes)

    def test_client_subject_keeps_every_organization(self):
        """Kubernetes maps each organization of a client certificate to a group."""
        orgs = [a.value for a in self.client.subject.get_attributes_for_oid(
            NameOID.ORGANIZATION_NAME)]
        self.assertEqual(orgs, ["system:masters", "team-a"])
        self.assertEqual(
            self.client.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value,
            "admin")

    def test_client_has_no_subject_alternative_name(self):
        with self.assertRaises(x509.ExtensionNotFound):
            _ext(self.client, x509.SubjectAlternativeName)
