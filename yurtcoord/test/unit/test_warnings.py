"""The test configuration's warning filters: a warning raised from the project's own
code is an error, under pytest and trial alike (trial names a module by its file
path); the dependencies' warnings listed in ``setup.cfg`` are ignored."""

import warnings

from twisted.trial import unittest

from yurtcoord.test import install_warning_filters, warning_filter_lines

SITE = "/venv/lib/python3.11/site-packages"


class WarningFilterTests(unittest.TestCase):
    def warn(self, message, category, filename, module=None):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            install_warning_filters(warning_filter_lines())
            if module is None:
                # As trial re-emits a warning: the module is then the file's path.
                warnings.warn_explicit(message, category, filename, 1)
            else:
                warnings.warn_explicit(message, category, filename, 1, module=module)

    def test_the_projects_warnings_are_errors_by_module_name_and_by_file_path(self):
        with self.assertRaises(DeprecationWarning):
            self.warn("old API", DeprecationWarning, "client.py", module="yurtcoord.kube.client")
        with self.assertRaises(UserWarning):
            self.warn("careful", UserWarning, "/src/yurtcoord/yurtcoord/pool/uploader.py")
        with self.assertRaises(ResourceWarning):
            self.warn("unclosed file", ResourceWarning, "/w/yurtcoord/test/test_x.py")

    def test_listed_dependency_warnings_are_ignored_and_others_not_made_errors(self):
        self.warn("twisted.internet.defer.returnValue was deprecated in Twisted 24.7.0",
                  DeprecationWarning, f"{SITE}/txaioetcd/_client_tx.py")
        self.warn("Passing pyOpenSSL X509 objects is deprecated.", DeprecationWarning,
                  "SSL.py", module="OpenSSL.SSL")
        self.warn("Passing pyOpenSSL PKey objects is deprecated.", DeprecationWarning,
                  f"{SITE}/OpenSSL/SSL.py")
        # A dependency installed under a checkout that is itself called yurtcoord.
        self.warn("anything", DeprecationWarning, f"/home/u/yurtcoord/.venv{SITE[5:]}/x/y.py")

    def test_the_filters_come_from_the_pytest_configuration(self):
        lines = warning_filter_lines()
        self.assertTrue(lines[0].startswith("error::Warning:"), lines)
        self.assertTrue(all(line.startswith("ignore:") for line in lines[1:]), lines)
