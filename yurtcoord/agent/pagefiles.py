"""The style and scripts of the HTML pages (the agent's pool page, the sandbox's
control page), kept as package data: ``static/*.css`` and ``static/*.js`` beside the
module of each page, shipped by setup.py's ``package_data``.

Each page reads its files once, when its module is imported, and puts them inline in
every page it renders, so that a page fetches nothing from elsewhere. A script is one
function expression taking the page's settings; the page calls it with them
(``page_script``), so that a file holds no value of its page's own.
"""
import json
from importlib import resources
from typing import Any, Mapping


def static_text(package: str, name: str) -> str:
    """The text of the package data file ``static/<name>`` of ``package``."""
    return resources.files(package).joinpath("static", name).read_text("utf-8")


def page_script(package: str, name: str, settings: Mapping[str, Any]) -> str:
    """The inline script of a page: the function of ``static/<name>`` of ``package``
    called with ``settings`` (JSON values)."""
    return static_text(package, name) + "(" + json.dumps(dict(settings)) + ");\n"
