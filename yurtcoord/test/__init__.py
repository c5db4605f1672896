"""The project's tests.

Importing this package applies the warning filters of the pytest configuration
(``filterwarnings`` in ``setup.cfg``) under trial as well: a warning raised from the
project's own code is an error, the dependencies' warnings listed there are ignored.
Trial re-emits the warnings collected during a test after it and reports the test as
failed when a filter turns one into an error.
"""

import builtins
import configparser
import os
import warnings

_SETUP_CFG = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "setup.cfg")


def warning_filter_lines(path: str = _SETUP_CFG) -> list:
    """The ``filterwarnings`` lines of the pytest section of ``path`` (none if absent)."""
    parser = configparser.ConfigParser(interpolation=None)
    if not parser.read(path, encoding="utf-8"):
        return []
    value = parser.get("tool:pytest", "filterwarnings", fallback="")
    return [line.strip() for line in value.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def install_warning_filters(lines: list) -> None:
    """Apply pytest-style ``action:message:category:module`` lines, in order (the last
    one takes precedence, as in pytest)."""
    for line in lines:
        action, message, category, module = (line.split(":", 4) + [""] * 4)[:4]
        warnings.filterwarnings(action.strip() or "default", message=message,
                                category=getattr(builtins, category.strip() or "Warning"),
                                module=module.strip())


install_warning_filters(warning_filter_lines())
