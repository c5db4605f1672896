"""The pool overlays as ``kubectl kustomize`` renders them, and their objects checked
against the Kubernetes schema of the version the manifests are written for.

``kubectl kustomize`` works offline; ``kubernetes-validate`` holds each rendered
object against the OpenAPI schema of ``KUBERNETES_VERSION`` in strict mode, where a
field the schema does not know (a misspelt one) is an error, which the kubernetes
client's models would silently drop. Both read files only: no cluster is involved.
"""

import os
import shutil
import subprocess
from typing import Any, Iterable

import kubernetes_validate
import yaml

from yurtcoord.testing.manifests import DEPLOY, KUBERNETES_VERSION

KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"
RENDER_TIMEOUT = 60.0


class RenderError(Exception):
    """``kubectl kustomize`` refused an overlay; the message is its error."""


def render(directory: str) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize directory`` renders, in its order."""
    done = subprocess.run([KUBECTL, "kustomize", directory], capture_output=True,
                          timeout=RENDER_TIMEOUT, check=False)
    if done.returncode != 0:
        raise RenderError(f"kubectl kustomize {directory}: "
                          f"{done.stderr.decode('utf-8', 'replace').strip()}")
    return [d for d in yaml.safe_load_all(done.stdout) if d is not None]


def name_of(document: dict[str, Any]) -> str:
    """``Kind namespace/name`` for messages."""
    metadata = document.get("metadata") or {}
    where = f"{metadata['namespace']}/" if metadata.get("namespace") else ""
    return f"{document.get('kind')} {where}{metadata.get('name')}"


def schema_problems(documents: Iterable[dict[str, Any]],
                    version: str = KUBERNETES_VERSION) -> list[str]:
    """One line per object that fails strict validation against the schema of
    ``version`` (``Kind ns/name: where: why``); empty when every one passes."""
    problems = []
    for document in documents:
        try:
            kubernetes_validate.validate(document, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            where = ".".join(str(part) for part in error.path)
            problems.append(f"{name_of(document)}: {where}: {error.message}")
        except (kubernetes_validate.SchemaNotFoundError,
                kubernetes_validate.InvalidSchemaError) as error:
            problems.append(f"{name_of(document)}: {error.message}")
    return problems


def copy_deploy(target: str) -> str:
    """A copy of ``deploy/`` under ``target`` (to change and render without touching
    the repository's); the copy's path."""
    copy = os.path.join(target, "deploy")
    shutil.copytree(DEPLOY, copy)
    return copy


def objects(documents: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The documents of ``kind``."""
    return [d for d in documents if d.get("kind") == kind]


def the_object(documents: Iterable[dict[str, Any]], kind: str,
               name: str = "") -> dict[str, Any]:
    """The one document of ``kind`` (named ``name`` when given)."""
    found = [d for d in objects(documents, kind)
             if not name or d["metadata"]["name"] == name]
    if len(found) != 1:
        raise AssertionError(f"{len(found)} objects of kind {kind} {name}".rstrip())
    return found[0]
