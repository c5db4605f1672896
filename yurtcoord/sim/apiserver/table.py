"""Minimal server-side ``Table`` output (meta.k8s.io/v1), which ``kubectl get``
asks for in its Accept header; columns are Name and Created At, like the
server's default table convertor."""

from typing import TYPE_CHECKING, Any

from twisted.web.iweb import IRequest

if TYPE_CHECKING:
    from yurtcoord.sim.apiserver.catalog import ResourceType

COLUMNS = [
    {"name": "Name", "type": "string", "format": "name", "priority": 0,
     "description": "Name must be unique within a namespace."},
    {"name": "Created At", "type": "date", "format": "", "priority": 0,
     "description": "CreationTimestamp is a timestamp representing the server time when "
                    "this object was created."},
]


def wants_table(request: IRequest) -> bool:
    accept = (request.getHeader(b"accept") or b"").decode()
    for option in accept.split(","):
        params = {p.strip() for p in option.split(";")[1:]}
        if "as=Table" in params and "g=meta.k8s.io" in params:
            return True
    return False


class TableEncoder:
    def __init__(self, resource_type: "ResourceType") -> None:
        self._type = resource_type

    @staticmethod
    def _row(obj: dict[str, Any]) -> dict[str, Any]:
        metadata = obj.get("metadata") or {}
        return {
            "cells": [metadata.get("name", ""), metadata.get("creationTimestamp")],
            "object": {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": metadata,
            },
        }

    def many(self, items: list[dict[str, Any]], resource_version: object,
             continue_token: str | None = None) -> dict[str, Any]:
        metadata = {"resourceVersion": str(resource_version)}
        if continue_token:
            metadata["continue"] = continue_token
        return {
            "kind": "Table",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": metadata,
            "columnDefinitions": COLUMNS,
            "rows": [self._row(item) for item in items],
        }

    def one(self, obj: dict[str, Any]) -> dict[str, Any]:
        rv = (obj.get("metadata") or {}).get("resourceVersion", "")
        return self.many([obj], rv)


def encoder_for(request: IRequest, resource_type: "ResourceType") -> "TableEncoder | None":

    """A TableEncoder when the client asked for a Table, else None."""
    return TableEncoder(resource_type) if wants_table(request) else None
