"""Terraform values as the stand-in provider sees them: msgpack decoding and schema-guided edits.

A value is plain Python data (``None`` is null) with :class:`Unknown` for a value not yet known.
Unknown values keep their raw msgpack extension, refinements included, so that a value the
provider passes through comes back to Terraform byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import msgpack

JSON = Any


class Unknown:
    """A value not yet known; ``ext`` is its msgpack extension as Terraform sent it."""

    __slots__ = ("ext",)

    def __init__(self, ext: msgpack.ExtType | None = None) -> None:
        self.ext = ext if ext is not None else msgpack.ExtType(0, b"")


def decode(data: bytes) -> Any:
    """A msgpack DynamicValue as Python data."""
    if not data:
        return None

    def ext_hook(code: int, payload: bytes) -> Any:
        return Unknown(msgpack.ExtType(code, payload))

    return msgpack.unpackb(data, raw=False, ext_hook=ext_hook, strict_map_key=False)


def encode(value: Any) -> bytes:
    """Python data as a msgpack DynamicValue."""

    def default(obj: Any) -> Any:
        if isinstance(obj, Unknown):
            return obj.ext
        raise TypeError(f"cannot encode {type(obj).__name__}")

    packed: bytes = msgpack.packb(value, default=default, use_bin_type=True)
    return packed


# ----------------------------------------------------------------- types implied by a schema block


def block_type(block: dict[str, JSON]) -> JSON:
    """The object type (cty JSON) a schema block implies."""
    attrs: dict[str, JSON] = {name: attribute_type(a) for name, a in block.get("attributes", {}).items()}
    for name, nested in block.get("block_types", {}).items():
        element = block_type(nested["block"])
        mode = nested["nesting_mode"]
        attrs[name] = element if mode in ("single", "group") else [mode, element]
    return ["object", attrs]


def attribute_type(attr: dict[str, JSON]) -> JSON:
    """The type (cty JSON) of a schema attribute, nested attribute types included."""
    if "type" in attr:
        return attr["type"]
    nested = attr["nested_type"]
    element = ["object", {name: attribute_type(a) for name, a in nested["attributes"].items()}]
    mode = nested["nesting_mode"]
    return element if mode == "single" else [mode, element]


# ----------------------------------------------------------------- placeholders and plans


def placeholder(cty_type: JSON, name: str) -> Any:
    """A plausible known value of a type, for a computed attribute the stand-in has to fill."""
    if cty_type == "string":
        return f"stand-in-{name}"
    if cty_type == "number":
        return 0
    if cty_type == "bool":
        return False
    if cty_type == "dynamic":
        return [b'"string"', f"stand-in-{name}"]
    kind = cty_type[0]
    if kind in ("list", "set", "tuple"):
        return []
    if kind == "map":
        return {}
    return {attr: placeholder(t, attr) for attr, t in cty_type[1].items()}


def fill_unknowns(value: Any, cty_type: JSON, name: str = "value") -> Any:
    """``value`` with every unknown replaced by a placeholder of its type."""
    if isinstance(value, Unknown):
        return placeholder(cty_type, name)
    if value is None or isinstance(cty_type, str):
        return value
    kind = cty_type[0]
    if kind in ("list", "set"):
        return [fill_unknowns(v, cty_type[1], name) for v in value]
    if kind == "map":
        return {k: fill_unknowns(v, cty_type[1], name) for k, v in value.items()}
    if kind == "tuple":
        return [fill_unknowns(v, t, name) for v, t in zip(value, cty_type[1], strict=False)]
    return {attr: fill_unknowns(value.get(attr), t, attr) for attr, t in cty_type[1].items()}


def mark_computed(value: Any, block: dict[str, JSON], fill: bool) -> Any:
    """A block value whose null computed attributes are unknown (``fill=False``) or placeholders."""
    if not isinstance(value, dict):
        return value
    out = dict(value)
    for name, attr in block.get("attributes", {}).items():
        current = out.get(name)
        if current is None and attr.get("computed"):
            out[name] = placeholder(attribute_type(attr), name) if fill else Unknown()
        elif current is not None and "nested_type" in attr:
            nested = {"attributes": attr["nested_type"]["attributes"]}
            out[name] = _each(
                current, attr["nested_type"]["nesting_mode"], lambda v, b=nested: mark_computed(v, b, fill)
            )
    for name, nested_block in block.get("block_types", {}).items():
        current = out.get(name)
        if current is not None and not isinstance(current, Unknown):
            inner = nested_block["block"]
            out[name] = _each(
                current, nested_block["nesting_mode"], lambda v, b=inner: mark_computed(v, b, fill)
            )
    return out


def _each(value: Any, mode: str, fn: Any) -> Any:
    if isinstance(value, Unknown):
        return value
    if mode in ("single", "group"):
        return fn(value)
    if mode == "map":
        return {k: fn(v) for k, v in value.items()}
    return [fn(v) for v in value]


def empty_object(block: dict[str, JSON]) -> dict[str, Any]:
    """A block value with every attribute null and no nested blocks."""
    out: dict[str, Any] = dict.fromkeys(block.get("attributes", {}))
    for name, nested in block.get("block_types", {}).items():
        mode = nested["nesting_mode"]
        out[name] = [] if mode in ("list", "set") else {} if mode == "map" else None
    return out


def from_json(value: JSON, cty_type: JSON) -> Any:
    """A value from Terraform's JSON state encoding, shaped to ``cty_type`` (missing attributes null)."""
    if value is None:
        return None
    if cty_type == "dynamic":
        if isinstance(value, dict) and set(value) == {"value", "type"}:
            return [json.dumps(value["type"]).encode(), from_json(value["value"], value["type"])]
        return [b'"string"', str(value)]
    if isinstance(cty_type, str):
        return value
    kind = cty_type[0]
    if kind in ("list", "set"):
        return [from_json(v, cty_type[1]) for v in value]
    if kind == "map":
        return {k: from_json(v, cty_type[1]) for k, v in value.items()}
    if kind == "tuple":
        return [from_json(v, t) for v, t in zip(value, cty_type[1], strict=False)]
    return {attr: from_json(value.get(attr), t) for attr, t in cty_type[1].items()}


# ----------------------------------------------------------------- replacement

AttributePath = list[str | int]  # attribute names and list indexes


def replace_paths(
    prior: Any, planned: Any, block: dict[str, JSON], force_new: Iterable[str]
) -> list[AttributePath]:
    """The ForceNew paths whose planned value differs from the prior one, as attribute paths.

    ``force_new`` holds paths as ``force_new.json`` writes them: attribute names joined with ``.``
    through nested blocks, ``BLOCK.#`` for the number of blocks. A returned path is a list of
    attribute names and list indexes. Like Terraform core, a planned value that is unknown (or holds
    an unknown) counts as a change. A path through a set of blocks stops at the set, as the SDK's
    does: the set requires replacement when an element added or removed has the attribute set.
    """
    found: list[AttributePath] = []
    for dotted in force_new:
        for path in _changed(prior, planned, block, dotted.split("."), []):
            if path not in found:
                found.append(path)
    return found


def _changed(
    prior: Any, planned: Any, block: dict[str, JSON], names: list[str], steps: AttributePath
) -> list[AttributePath]:
    name, rest = names[0], names[1:]
    old = prior.get(name) if isinstance(prior, dict) else None
    new = planned.get(name) if isinstance(planned, dict) else None
    if isinstance(planned, Unknown):
        new = planned
    here = [*steps, name]
    nested = block.get("block_types", {}).get(name)
    if nested is None:  # an attribute, or a name this provider's schema lacks
        known = name in block.get("attributes", {})
        return [here] if known and _differs(old, new) else []
    if isinstance(new, Unknown):
        return [here]
    mode = nested["nesting_mode"]
    if rest == ["#"]:
        return [here] if _count(old, mode) != _count(new, mode) else []
    inner = nested["block"]
    if mode in ("single", "group"):
        return _changed(old, new, inner, rest, here)
    if mode == "map":  # the SDK has no such blocks: the whole map is compared
        return [here] if _differs(old, new) else []
    olds, news = old or [], new or []
    if mode == "set":
        added = [v for v in news if not any(_same(v, w) for w in olds)]
        removed = [v for v in olds if not any(_same(v, w) for w in news)]
        pairs = [(None, v) for v in added] + [(v, None) for v in removed]
        return [here] if any(_changed(a, b, inner, rest, here) for a, b in pairs) else []
    paths: list[AttributePath] = []
    for index in range(max(len(olds), len(news))):  # a block added or removed compares with null
        before = olds[index] if index < len(olds) else None
        after = news[index] if index < len(news) else None
        paths.extend(_changed(before, after, inner, rest, [*here, index]))
    return paths


def _count(value: Any, mode: str) -> int:
    if value is None:
        return 0
    return 1 if mode in ("single", "group") else len(value)


def _has_unknown(value: Any) -> bool:
    if isinstance(value, Unknown):
        return True
    if isinstance(value, dict):
        return any(_has_unknown(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_unknown(v) for v in value)
    return False


def _same(a: Any, b: Any) -> bool:
    return not _has_unknown(a) and not _has_unknown(b) and a == b


def _differs(old: Any, new: Any) -> bool:
    return _has_unknown(new) or old != new
