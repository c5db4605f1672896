"""The one JSON decoder of what the agent reads from Kubernetes and its local cache:
the watch streams, the API's answers and the yurthub cache files it uploads.

msgspec's decoder, on the bytes as read. bench/decoders.py weighs it against the
stdlib's ``json`` and ``orjson``, and it met the rule for a decoder beside the stdlib
(at least 20% more watch events a second from the request to the last event, at most
2 MB more memory; bench/RESULTS.md). On a pod of a few KB it takes a third of the
stdlib's time.

It takes UTF-8 only, without a byte order mark, and JSON as RFC 8259 defines it, no
more: ``NaN``, ``Infinity``, a number beyond a double's range and a lone surrogate
escape are not JSON here. The stdlib's decoder takes each of them (a float ``nan`` or
``inf``; a string that cannot be encoded again), and neither a Kubernetes apiserver
nor the coordinator apiserver that reads the pool store back produces or reads them.
It keeps one string per distinct short key for everything it decodes, so the objects
an informer stores share their keys' strings.

The etcd client's answers go through the stdlib (``yurtcoord.etcd``).
"""

from typing import Any, Callable

import msgspec

__all__ = ["NotJSON", "decode_json"]

# One JSON document, as bytes, to its value. Raises ``NotJSON`` (a ValueError) for
# anything that is not exactly one JSON value (surrounding whitespace allowed), and
# RecursionError past its nesting limit.
decode_json: Callable[[bytes], Any] = msgspec.json.Decoder().decode

NotJSON = msgspec.DecodeError
