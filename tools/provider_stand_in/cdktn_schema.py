"""Rebuild a provider schema (``terraform providers schema -json`` format) from a cdktn prebuilt provider.

The PyPI packages ``cdktn-provider-google`` and ``cdktn-provider-google-beta`` hold, in a jsii tarball,
the JavaScript bindings generated from the real provider schema. Those bindings keep, for every
attribute of every resource, data source and nested block, a comment
``// NAME - computed: B, optional: B, required: B`` and, for each configurable argument, an entry
``NAME: {value, isBlock, type, storageClassType}``. This module reads them back into schema JSON.

What the bindings do not keep, and so the rebuilt schema lacks: descriptions, ``sensitive``,
``deprecated``, schema versions, provider functions and ephemeral resources. Block nesting
(list, set, single), ``max_items = 1``, ``min_items = 1`` (a required block), attribute types and the
required/optional/computed flags are kept.
"""

from __future__ import annotations

import io
import re
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

JSON = Any

_CLASS_RE = re.compile(r"^class (\w+) extends cdktn\.(\w+) \{\n(.*?)^\}\n", re.M | re.S)
_SYNTH_FN_RE = re.compile(r"^function (\w+)ToHclTerraform\(struct\) \{\n(.*?)^\}\n", re.M | re.S)
_SYNTH_METHOD_RE = re.compile(r"^    synthesizeHclAttributes\(\) \{\n(.*?)^    \}\n", re.M | re.S)
_SYNTH_ENTRY_RE = re.compile(
    r'^\s+(\w+): \{\n\s+value: [^\n]*\n\s+isBlock: (true|false),\n\s+type: "(\w+)",\n'
    r'\s+storageClassType: "(\w+)",',
    re.M,
)
_ATTR_RE = re.compile(
    r"^    // (\w+) - computed: (true|false), optional: (true|false), required: (true|false)\n"
    r"(.*?)(?=^    // \w+ - computed: |\Z)",
    re.M | re.S,
)
_TYPE_NAME_RE = re.compile(r'^    static tfResourceType = "(\w+)";', re.M)
_NEW_COMPLEX_RE = re.compile(
    r'new (?!cdktn\.)(?:\w+\.)?(\w+?)(OutputReference|List|Map)\(this, "\w+"(?:, (true|false))?\)'
)

_SIMPLE = {"string": "string", "number": "number", "boolean": "bool"}
_GETTERS = [  # checked in order: the first pattern found in an attribute's getter gives its type
    ("cdktn.Fn.tolist(this.getListAttribute(", ["set", "string"]),
    ("cdktn.Fn.tolist(this.getNumberListAttribute(", ["set", "number"]),
    ("this.getNumberListAttribute(", ["list", "number"]),
    ("this.getListAttribute(", ["list", "string"]),
    ("this.getStringMapAttribute(", ["map", "string"]),
    ("this.getNumberMapAttribute(", ["map", "number"]),
    ("this.getBooleanMapAttribute(", ["map", "bool"]),
    ("new cdktn.StringMapList(", ["list", ["map", "string"]]),
    ("new cdktn.StringMap(", ["map", "string"]),
    ("new cdktn.NumberMap(", ["map", "number"]),
    ("new cdktn.BooleanMap(", ["map", "bool"]),
    ("new cdktn.AnyMap(", ["map", "dynamic"]),
    ("this.getStringAttribute(", "string"),
    ("this.getNumberAttribute(", "number"),
    ("this.getBooleanAttribute(", "bool"),
    ("this.interpolationForAttribute(", "dynamic"),
]


class _Module:
    """The classes and HCL synthesis tables of one generated module (one resource or data source)."""

    def __init__(self, source: str) -> None:
        self.classes: dict[str, tuple[str, str]] = {
            m.group(1): (m.group(2), m.group(3)) for m in _CLASS_RE.finditer(source)
        }
        self.synth: dict[str, dict[str, tuple[bool, str, str]]] = {
            m.group(1): _synth_entries(m.group(2)) for m in _SYNTH_FN_RE.finditer(source)
        }
        self._open: set[str] = set()  # the bindings reuse a class for a block nested in itself: cut there

    def block(self, class_name: str, synth: dict[str, tuple[bool, str, str]]) -> dict[str, JSON]:
        """The schema block of a class: its attributes and nested block types."""
        if class_name in self._open or class_name not in self.classes:
            return {"attributes": {}}
        self._open.add(class_name)
        try:
            return self._block(class_name, synth)
        finally:
            self._open.discard(class_name)

    def _block(self, class_name: str, synth: dict[str, tuple[bool, str, str]]) -> dict[str, JSON]:
        body = self.classes[class_name][1]
        attributes: dict[str, JSON] = {}
        block_types: dict[str, JSON] = {}
        for m in _ATTR_RE.finditer(body):
            name, computed, optional, required, getter = m.groups()
            flags = {
                "computed": computed == "true",
                "optional": optional == "true",
                "required": required == "true",
            }
            entry = synth.get(name)
            if entry is not None and entry[0]:
                block_types[name] = self._nested_block(entry, getter, flags["required"])
                continue
            attr_type = _synth_type(entry) if entry is not None else self._getter_type(getter)
            if attr_type is None:
                continue
            attributes[name] = {"type": attr_type, **{k: True for k, v in flags.items() if v}}
        block: dict[str, JSON] = {"attributes": attributes}
        if block_types:
            block["block_types"] = block_types
        return block

    def _nested_block(self, entry: tuple[bool, str, str], getter: str, required: bool) -> dict[str, JSON]:
        _, kind, storage = entry
        struct = storage[: -len("List")] if kind in ("list", "set") and storage.endswith("List") else storage
        child = self.block(struct + "OutputReference", self.synth.get(_lower_first(struct), {}))
        nested: dict[str, JSON] = {"nesting_mode": "single" if kind == "struct" else kind, "block": child}
        if kind in ("list", "set"):
            single = (m := _NEW_COMPLEX_RE.search(getter)) is not None and m.group(2) == "OutputReference"
            if single:
                nested["max_items"] = 1
            if required:
                nested["min_items"] = 1
        return nested

    def _getter_type(self, getter: str) -> JSON | None:
        m = _NEW_COMPLEX_RE.search(getter)
        if m is not None:
            element = self._object_type(m.group(1) + "OutputReference")
            if m.group(2) == "Map":
                return ["map", element]
            if m.group(2) == "List":
                return ["set" if m.group(3) == "true" else "list", element]
            return ["list", element]  # a computed block of the legacy SDK: a list of at most one object
        for needle, attr_type in _GETTERS:
            if needle in getter:
                return attr_type
        return None

    def _object_type(self, class_name: str) -> JSON:
        if class_name not in self.classes or class_name in self._open:
            return "dynamic"
        block = self.block(class_name, {})
        return ["object", _implied_attribute_types(block)]


def _implied_attribute_types(block: dict[str, JSON]) -> dict[str, JSON]:
    types: dict[str, JSON] = {name: a["type"] for name, a in block["attributes"].items()}
    for name, nested in block.get("block_types", {}).items():
        element = ["object", _implied_attribute_types(nested["block"])]
        mode = nested["nesting_mode"]
        types[name] = element if mode == "single" else [mode, element]
    return types


def _synth_entries(body: str) -> dict[str, tuple[bool, str, str]]:
    return {
        m.group(1): (m.group(2) == "true", m.group(3), m.group(4)) for m in _SYNTH_ENTRY_RE.finditer(body)
    }


def _synth_type(entry: tuple[bool, str, str]) -> JSON | None:
    _, kind, storage = entry
    if kind == "simple":
        return _SIMPLE.get(storage)
    element = {
        "stringList": "string",
        "numberList": "number",
        "booleanList": "bool",
        "stringMap": "string",
        "numberMap": "number",
        "booleanMap": "bool",
    }.get(storage)
    if element is None:
        return None
    return [kind, element]


def _lower_first(name: str) -> str:
    return name[:1].lower() + name[1:]


def _module_sources(tarball: tarfile.TarFile) -> Iterator[str]:
    """The JavaScript of each generated module, its struct files appended."""
    modules: dict[str, list[tarfile.TarInfo]] = {}
    for member in tarball.getmembers():
        parts = member.name.split("/")
        if len(parts) >= 4 and parts[:2] == ["package", "lib"] and member.name.endswith(".js"):
            modules.setdefault(parts[2], []).append(member)
    for members in modules.values():
        chunks = []
        for member in sorted(members, key=lambda m: m.name):
            f = tarball.extractfile(member)
            if f is not None:
                chunks.append(f.read().decode())
        yield "".join(chunks)


def _jsii_tarball(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".jsii.tgz"))
        return zf.read(name)


def bound_provider_version(wheel: Path) -> str:
    """The provider version a cdktn wheel was generated from (its README says), or ``unknown``."""
    with tarfile.open(fileobj=io.BytesIO(_jsii_tarball(wheel))) as tarball:
        readme = tarball.extractfile("package/README.md")
        text = readme.read().decode() if readme is not None else ""
    m = re.search(r"provider version (\d+\.\d+\.\d+)", text)
    return m.group(1) if m else "unknown"


def schema_from_wheel(wheel: Path, provider_source: str) -> dict[str, JSON]:
    """The provider schema JSON (``terraform providers schema -json`` layout) rebuilt from a cdktn wheel."""
    data = _jsii_tarball(wheel)
    resources: dict[str, JSON] = {}
    data_sources: dict[str, JSON] = {}
    provider: dict[str, JSON] = {"version": 0, "block": {"attributes": {}}}
    with tarfile.open(fileobj=io.BytesIO(data)) as tarball:
        for source in _module_sources(tarball):
            module = _Module(source)
            for class_name, (base, body) in module.classes.items():
                if base == "TerraformProvider":
                    m = _SYNTH_METHOD_RE.search(body)
                    block = module.block(class_name, _synth_entries(m.group(1)) if m else {})
                    block["attributes"].pop("alias", None)
                    provider = {"version": 0, "block": block}
                    continue
                if base not in ("TerraformResource", "TerraformDataSource"):
                    continue
                type_name = _TYPE_NAME_RE.search(body)
                synth = _SYNTH_METHOD_RE.search(body)
                if type_name is None:
                    continue
                block = module.block(class_name, _synth_entries(synth.group(1)) if synth else {})
                target = resources if base == "TerraformResource" else data_sources
                target[type_name.group(1)] = {"version": 0, "block": block}
    return {
        "format_version": "1.0",
        "provider_schemas": {
            provider_source: {
                "provider": provider,
                "resource_schemas": resources,
                "data_source_schemas": data_sources,
            }
        },
    }
