"""Where the project's files are, for tests that read them (docs, manifests, examples).

Test modules live one package deeper per tier (``yurtcoord/test/<tier>/``); each
asks here instead of counting ``dirname`` calls from its own file.
"""

import os

PRODUCT_PACKAGE: str = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""The ``yurtcoord`` package directory."""

REPO: str = os.path.dirname(PRODUCT_PACKAGE)
"""The checkout: setup.py, docs/, etc/, deploy/, bench/."""
