"""A small, closed JSON encoding for the static metadata of known boxes
(names, rules, NNX variable metadata, Penzai labels).

Only plain data crosses: None, bool, int, float, str, tuple, list, dicts with
string keys and jax PartitionSpecs. Anything else raises ``Unencodable`` and
the caller drops that item. Decoding never imports or calls anything named in
the file.
"""

from __future__ import annotations

import json
import sys
from typing import Any


class Unencodable(Exception):
    pass


def _enc(x: Any) -> Any:
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, (int, float)):
        return int(x) if isinstance(x, int) else float(x)
    ps = _partition_spec_type()
    if ps is not None and isinstance(x, ps):
        return {"P": [_enc(e) for e in tuple(x)]}
    if isinstance(x, tuple):
        return {"t": [_enc(e) for e in x]}
    if isinstance(x, list):
        return [_enc(e) for e in x]
    if isinstance(x, dict):
        if not all(isinstance(k, str) for k in x):
            raise Unencodable("a dict key that is not a str")
        return {"d": [[k, _enc(v)] for k, v in x.items()]}
    raise Unencodable(type(x))


def _dec(x: Any) -> Any:
    if isinstance(x, list):
        return [_dec(e) for e in x]
    if isinstance(x, dict):
        if "t" in x:
            return tuple(_dec(e) for e in x["t"])
        if "d" in x:
            return {k: _dec(v) for k, v in x["d"]}
        if "P" in x:
            ps = _partition_spec_type(import_jax=True)
            entries = [_dec(e) for e in x["P"]]
            return ps(*entries) if ps is not None else tuple(entries)
        raise ValueError("bad static encoding")
    return x


def encode(x: Any) -> str:
    """JSON text for `x`; raises Unencodable."""
    return json.dumps(_enc(x), separators=(",", ":"))


def decode(text: str) -> Any:
    return _dec(json.loads(text))


def encodable(x: Any) -> bool:
    try:
        _enc(x)
        return True
    except Unencodable:
        return False


def _partition_spec_type(import_jax: bool = False):
    mod = sys.modules.get("jax.sharding")
    if mod is None and import_jax:
        try:
            import jax.sharding as mod  # noqa: F811
        except ImportError:
            return None
    return getattr(mod, "PartitionSpec", None) if mod is not None else None
