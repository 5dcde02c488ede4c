"""Which attribute changes force the real google providers to replace a resource: ``force_new.json``.

The stand-in serves the providers' schemas, which do not say what an SDKv2 provider marks
``ForceNew: true`` in its Go resource schema. This module reads that from a checkout of the
provider's source and writes the attribute paths, per resource type, to ``force_new.json`` beside
it; :mod:`.server` plans a replacement when one of them changes. Tests read only the JSON::

    python -m tools.provider_stand_in.force_new PROVIDER_SOURCE_DIR [PROVIDER_SOURCE_DIR ...]

where each directory is a checkout of hashicorp/terraform-provider-google-beta (and -google) at the
release the stand-in's schema comes from (``python -m tools.provider_stand_in env`` prints it), e.g.
``git clone --depth 1 --branch v7.46.1 https://github.com/hashicorp/terraform-provider-google-beta``;
``--ref`` records what was checked out when the directory is not a git checkout.

A path joins attribute names with ``.``, through nested blocks (``time_partitioning.field``).
``BLOCK.#`` is the number of ``BLOCK`` blocks: on a ``ForceNew`` block the SDK forces replacement
only when blocks are added or removed, the attributes inside follow their own ``ForceNew``. A
``ForceNew`` list, set or map of plain values forces replacement on any change of its elements.

The reader is a small Go scanner, not a Go compiler: it follows composite literals, package-level
variables, locals and function calls (``Elem: someSchema()``, ``tpgresource.MergeSchemas(a, b)``)
as far as the providers' resource schemas need, and stops with an error on anything it does not
understand rather than guess. ``CustomizeDiff`` functions that call ``ForceNew`` decide at plan
time; they cannot be read off the schema, so :data:`CONDITIONAL` describes the ones reviewed by
hand, and the scan fails on any it finds that is not described there.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.provider_stand_in.environment import PROVIDERS, REPO_ROOT, provider_version, referenced_types

OUTPUT = Path(__file__).with_name("force_new.json")

# Types the module is about to use, on top of those its .tf files name today.
UPCOMING_TYPES = frozenset(
    {
        "google_artifact_registry_repository",
        "google_artifact_registry_repository_iam_member",
        "google_project_service_identity",
        "google_kms_crypto_key_iam_member",
        "google_service_account",
        "google_storage_bucket_iam_member",
        "google_project_iam_member",
        "google_bigquery_job",
    }
)


def scanned_dirs() -> list[Path]:
    """The folders whose Terraform files name the types the stand-in serves to this project."""
    return [REPO_ROOT / "terraform", REPO_ROOT / "tests" / "e2e" / "terraform_mistakes"]


def wanted_types() -> set[str]:
    """The types ``force_new.json`` must describe: the google types the project names, and the upcoming.

    Other types (``terraform_data``) are Terraform's own, not the stand-in's.
    """
    return {t for t in referenced_types(scanned_dirs()) if t.startswith("google_")} | UPCOMING_TYPES


# CustomizeDiff functions that force replacement under a condition, reviewed by hand. The scan
# finds every function reachable from a resource's CustomizeDiff that calls ForceNew, and every
# customdiff.ForceNewIf(Change) there, and fails unless it is listed here for that type (for the
# latter, with the attribute it watches as "force_new").
CONDITIONAL: dict[str, list[dict[str, Any]]] = {
    "google_dataflow_flex_template_job": [
        {
            "function": "resourceDataflowFlexJobTypeCustomizeDiff",
            "force_new": "every changed attribute",
            "except": ["on_delete", "terraform_labels"],
            "when": "the job's computed `type` is JOB_TYPE_BATCH",
            "note": (
                "A batch job is replaced on a change of any attribute but on_delete and "
                "terraform_labels. Any other job (JOB_TYPE_STREAMING: the only kind this project "
                "runs) is updated in place, by a relaunch with update=true, unless an attribute of "
                "the unconditional list under resources changes; that list is what the stand-in "
                "applies. The same function copies parameters.numWorkers, parameters.maxNumWorkers "
                "and parameters.enableStreamingEngine, when given, into num_workers, max_workers and "
                "enable_streaming_engine (SetNew), so changing those parameters replaces the job too; "
                "the stand-in does not follow that copy."
            ),
        }
    ],
    "google_bigquery_table": [
        {
            "function": "resourceBigQueryTableSchemaCustomizeDiffFunc",
            "force_new": "schema",
            "when": "BigQuery cannot apply the schema change in place",
            "note": (
                "In place: columns added as NULLABLE or REPEATED, a mode relaxed from REQUIRED to "
                "NULLABLE, descriptions and policy tags, top-level columns dropped (not together with "
                "columns added, not on an external table, not with row access policies). Anything "
                "else forces replacement: a column renamed or retyped (INTEGER/INT64, FLOAT/FLOAT64, "
                "BOOLEAN/BOOL count as equal), a REQUIRED column added, a nested column dropped. Not "
                "applied by the stand-in."
            ),
        }
    ],
    "google_storage_bucket": [
        {
            "function": "customdiff.ForceNewIfChange",
            "force_new": "retention_policy.is_locked",
            "when": "it changes from true to false (isPolicyLocked)",
            "note": "Unlocking a locked retention policy forces replacement. Not applied by the stand-in.",
        }
    ],
    "google_compute_subnetwork": [
        {
            "function": "customdiff.ForceNewIfChange",
            "force_new": "ip_cidr_range",
            "when": "the new range does not contain the old one (IsShrinkageIpCidr)",
            "note": "Expanding ip_cidr_range is an in-place update. Not applied by the stand-in.",
        }
    ],
}


# ----------------------------------------------------------------- Go tokens


_TOKEN = re.compile(
    r"""(?P<space>\s+)
    |(?P<comment>//[^\n]*|/\*.*?\*/)
    |(?P<string>`[^`]*`|"(?:\\.|[^"\\\n])*")
    |(?P<char>'(?:\\.|[^'\\\n])+')
    |(?P<name>[A-Za-z_][A-Za-z0-9_]*)
    |(?P<number>\.?[0-9][0-9A-Za-z_.]*)
    |(?P<op>:=|\.\.\.|&&|\|\||==|!=|<=|>=|<-|\+\+|--|[-+*/%&|^<>=!(){}\[\],;:.~])""",
    re.S | re.X,
)
_OPEN = {"(": ")", "{": "}", "[": "]"}


@dataclass(frozen=True)
class Token:
    kind: str
    text: str


_ENDS_STATEMENT = {"break", "continue", "fallthrough", "return", "++", "--", ")", "]", "}"}


def tokenize(source: str) -> list[Token]:
    """Go source as tokens, without spaces and comments, with the semicolons Go inserts at line ends."""
    tokens: list[Token] = []
    position = 0
    while position < len(source):
        match = _TOKEN.match(source, position)
        if match is None:
            raise ValueError(f"cannot read Go source at {source[position : position + 40]!r}")
        position = match.end()
        kind = match.lastgroup or ""
        if kind in ("space", "comment"):
            ends_line = "\n" in match.group() or match.group().startswith("//")
            last = tokens[-1] if tokens else None
            if (
                ends_line
                and last is not None
                and (last.kind in ("name", "string", "number", "char") or last.text in _ENDS_STATEMENT)
            ):
                tokens.append(Token("op", ";"))
        else:
            tokens.append(Token(kind, match.group()))
    return tokens


def _closing(tokens: list[Token], start: int) -> int:
    """The index of the bracket closing the one at ``start``."""
    depth = 0
    for index in range(start, len(tokens)):
        text = tokens[index].text
        if tokens[index].kind != "op":
            continue
        if text in _OPEN:
            depth += 1
        elif text in (")", "}", "]"):
            depth -= 1
            if depth == 0:
                return index
    raise ValueError("unbalanced brackets")


# ----------------------------------------------------------------- Go expressions, as far as needed


@dataclass
class Composite:
    """``T{...}`` or ``{...}``: entries are (key or None, value)."""

    type: str
    entries: list[tuple[str | None, Any]]


@dataclass
class Call:
    function: str  # "name" or "package.name"
    args: list[Any]


@dataclass
class Name:
    text: str  # "name" or "package.name"


@dataclass
class Literal:
    text: str


@dataclass
class Opaque:
    """An expression the scan does not interpret (a function literal, an operation...)."""

    text: str


_END = {",", ")", "}", "]", ";"}


def parse_expression(tokens: list[Token], index: int) -> tuple[Any, int]:
    """The expression starting at ``index`` and the index after it."""
    node, index = _primary(tokens, index)
    if index < len(tokens) and tokens[index].text not in _END and tokens[index].text != ":":
        start = index  # an operation on the primary: not interpreted
        while index < len(tokens) and tokens[index].text not in _END:
            index = _closing(tokens, index) + 1 if tokens[index].text in _OPEN else index + 1
        node = Opaque(" ".join(t.text for t in tokens[start - 1 : index]))
    return node, index


def _primary(tokens: list[Token], index: int) -> tuple[Any, int]:
    token = tokens[index]
    if token.text in ("&", "*"):
        return _primary(tokens, index + 1)
    if token.kind in ("string", "number", "char"):
        return Literal(token.text), index + 1
    if token.text == "func":
        body = index
        while tokens[body].text != "{" or _is_signature_brace(tokens, index, body):
            body = _closing(tokens, body) + 1 if tokens[body].text in ("(", "[") else body + 1
        end = _closing(tokens, body) + 1
        return Opaque("func literal"), end
    if token.text == "{":
        return _composite("", tokens, index)
    if token.text in ("map", "["):
        start = index  # a type: up to the brace of its literal
        while tokens[index].text != "{":
            index = _closing(tokens, index) + 1 if tokens[index].text == "[" else index + 1
        return _composite(" ".join(t.text for t in tokens[start:index]), tokens, index)
    if token.kind != "name":
        raise ValueError(f"unexpected {token.text!r} in an expression")
    text = token.text
    index += 1
    while index + 1 < len(tokens) and tokens[index].text == "." and tokens[index + 1].kind == "name":
        text += "." + tokens[index + 1].text
        index += 2
    node: Any = Name(text)
    while index < len(tokens):
        following = tokens[index].text
        if following == "{" and (text[0].isupper() or "." in text):  # a literal of a named type
            node, index = _composite(text, tokens, index)
        elif following == "(":
            end = _closing(tokens, index)
            node = Call(text, _arguments(tokens, index + 1, end))
            index = end + 1
        elif following == "[":
            node = Opaque(f"{text}[...]")
            index = _closing(tokens, index) + 1
        elif following == "." and tokens[index + 1].kind == "name":
            node = Opaque(f"{text}(...).{tokens[index + 1].text}")
            index += 2
        else:
            break
    return node, index


def _is_signature_brace(tokens: list[Token], start: int, brace: int) -> bool:
    """Whether the ``{`` at ``brace`` opens a type in a function signature (``interface{}``)."""
    return brace > start and tokens[brace - 1].text in ("interface", "struct")


def _arguments(tokens: list[Token], index: int, end: int) -> list[Any]:
    args = []
    while index < end:
        node, index = parse_expression(tokens, index)
        args.append(node)
        if tokens[index].text == "...":
            index += 1
        if tokens[index].text == ",":
            index += 1
    return args


def _composite(type_text: str, tokens: list[Token], brace: int) -> tuple[Composite, int]:
    end = _closing(tokens, brace)
    entries: list[tuple[str | None, Any]] = []
    index = brace + 1
    while index < end:
        key: str | None = None
        if tokens[index + 1].text == ":" and tokens[index].kind in ("name", "string"):
            key = tokens[index].text
            index += 2
        value, index = parse_expression(tokens, index)
        entries.append((key, value))
        if tokens[index].text == ",":
            index += 1
    return Composite(type_text, entries), end + 1


# ----------------------------------------------------------------- Go packages


@dataclass
class Function:
    params: list[str]
    body: list[Token]
    file: GoFile


@dataclass
class GoFile:
    package: Package
    imports: dict[str, str]  # local name -> import path


@dataclass
class Package:
    directory: Path
    tokens: dict[str, list[Token]] = field(default_factory=dict)
    functions: dict[str, Function] = field(default_factory=dict)
    variables: dict[str, tuple[list[Token], int, GoFile]] = field(default_factory=dict)


class Source:
    """A provider checkout: its Go packages, read on demand."""

    def __init__(self, root: Path) -> None:
        self.root = root
        module = re.search(r"^module\s+(\S+)", (root / "go.mod").read_text(), re.M)
        if module is None:
            raise ValueError(f"{root}/go.mod names no module")
        self.module = module.group(1)
        self.provider = self.module.rsplit("/", 1)[1].removeprefix("terraform-provider-")
        self._packages: dict[Path, Package] = {}

    def package(self, directory: Path) -> Package:
        if directory not in self._packages:
            self._packages[directory] = self._read_package(directory)
        return self._packages[directory]

    def package_of_import(self, path: str) -> Package | None:
        if not path.startswith(self.module + "/"):
            return None  # the SDK, the Go API clients...
        return self.package(self.root / path.removeprefix(self.module + "/"))

    def _read_package(self, directory: Path) -> Package:
        package = Package(directory)
        for path in sorted(directory.glob("*.go")):
            if path.name.endswith("_test.go"):
                continue
            tokens = tokenize(path.read_text())
            go_file = GoFile(package, _imports(tokens))
            package.tokens[path.name] = tokens
            _index_declarations(tokens, go_file, package)
        return package

    def registered_resources(self, types: Iterable[str]) -> dict[str, tuple[Any, GoFile]]:
        """The ``registry.Schema{...}`` of each resource among ``types``: its Schema expression, its file."""
        wanted = set(types)
        found: dict[str, tuple[Any, GoFile]] = {}
        names = re.compile(r'\bName:\s*"(google_[a-z0-9_]+)"')
        for path in sorted((self.root / self.provider).rglob("*.go")):
            if path.name.endswith("_test.go"):
                continue
            text = path.read_text()
            if "registry.Schema{" not in text or not wanted.intersection(names.findall(text)):
                continue
            tokens = self.package(path.parent).tokens[path.name]
            go_file = GoFile(self.package(path.parent), _imports(tokens))
            for index in range(len(tokens) - 3):
                if [t.text for t in tokens[index : index + 4]] != ["registry", ".", "Schema", "{"]:
                    continue
                entries = dict(_composite("registry.Schema", tokens, index + 3)[0].entries)
                name, kind = entries.get("Name"), entries.get("Type")
                if (
                    isinstance(name, Literal)
                    and isinstance(kind, Name)
                    and kind.text in ("registry.SchemaTypeResource", "registry.SchemaTypeIAMResource")
                    and json.loads(name.text) in wanted
                ):
                    found[json.loads(name.text)] = (entries["Schema"], go_file)
        return found


def _imports(tokens: list[Token]) -> dict[str, str]:
    """A file's imports: the name each is used by -> its path."""
    imports: dict[str, str] = {}
    index = 3 if tokens[2].text == ";" else 2  # after `package name`
    while index < len(tokens) and tokens[index].text in ("import", ";"):
        if tokens[index].text == ";":
            index += 1
            continue
        if tokens[index + 1].text == "(":
            end = _closing(tokens, index + 1)
            specs = tokens[index + 2 : end]
        else:
            end = index + (2 if tokens[index + 1].kind == "string" else 3)
            specs = tokens[index + 1 : end]
        index = end + 1
        alias = None
        for token in specs:
            if token.kind == "string":
                path = token.text[1:-1]
                imports[alias or path.rsplit("/", 1)[-1]] = path
                alias = None
            elif token.text != ";":
                alias = token.text
    return imports


def _index_declarations(tokens: list[Token], go_file: GoFile, package: Package) -> None:
    """Record the package-level functions (not methods) and variables of a file."""
    index = 0
    while index < len(tokens):
        text = tokens[index].text
        if text == "func" and tokens[index + 1].kind == "name" and tokens[index + 2].text == "(":
            params_end = _closing(tokens, index + 2)
            body = params_end + 1
            while tokens[body].text != "{" or tokens[body - 1].text in ("interface", "struct"):
                body = _closing(tokens, body) + 1 if tokens[body].text in ("(", "[", "{") else body + 1
            end = _closing(tokens, body)
            params = _param_names(tokens[index + 3 : params_end])
            package.functions[tokens[index + 1].text] = Function(params, tokens[body + 1 : end], go_file)
            index = end + 1
        elif text == "var" and tokens[index + 1].text == "(":
            end = _closing(tokens, index + 1)
            _index_variables(tokens, index + 2, end, go_file, package)
            index = end + 1
        elif text == "var":
            index = _index_variables(tokens, index + 1, None, go_file, package)
        elif text in _OPEN:
            index = _closing(tokens, index) + 1
        else:
            index += 1


def _index_variables(
    tokens: list[Token], index: int, end: int | None, go_file: GoFile, package: Package
) -> int:
    """Record ``name [type] = value`` declarations; the values are parsed when looked up."""
    while index < (len(tokens) if end is None else end):
        name, single = tokens[index].text, tokens[index + 1].text != ","
        while tokens[index].text not in ("=", ";"):  # skip the names and an explicit type
            index = _closing(tokens, index) + 1 if tokens[index].text in _OPEN else index + 1
        if tokens[index].text == "=" and single:
            package.variables[name] = (tokens, index + 1, go_file)
        while tokens[index].text != ";":
            index = _closing(tokens, index) + 1 if tokens[index].text in _OPEN else index + 1
        index += 1
        if end is None:
            break
    return index


def _param_names(tokens: list[Token]) -> list[str]:
    """Parameter names of a signature (``a, b map[string]*schema.Schema, f Func``)."""
    names: list[str] = []
    groups: list[list[Token]] = [[]]
    index = 0
    while index < len(tokens):
        if tokens[index].text == ",":
            groups.append([])
            index += 1
            continue
        if tokens[index].text in _OPEN:
            end = _closing(tokens, index)
            groups[-1].extend(tokens[index : end + 1])
            index = end + 1
            continue
        groups[-1].append(tokens[index])
        index += 1
    for group in groups:
        if group and group[0].kind == "name":
            names.append(group[0].text)
    return names


# ----------------------------------------------------------------- schema evaluation


@dataclass
class Field:
    """One entry of a ``map[string]*schema.Schema``: what matters to ForceNew."""

    type: str
    force_new: bool
    elem: dict[str, Field] | Field | None  # a block's schema, a collection's element, or none


@dataclass
class Scope:
    """Where a name is looked up: a file, a function's locals, the arguments bound to its parameters."""

    source: Source
    file: GoFile
    locals: list[Token] = field(default_factory=list)
    bound: dict[str, tuple[Any, Scope]] = field(default_factory=dict)

    def resolve(self, name: str) -> tuple[Any, Scope]:
        """The expression a name stands for, and the scope to evaluate it in."""
        if name in self.bound:
            return self.bound[name]
        if "." not in name:
            local = _local_assignment(self.locals, name)
            if local is not None:
                return local, self
            package = self.file.package
            if name in package.variables:
                tokens, index, go_file = package.variables[name]
                return parse_expression(tokens, index)[0], Scope(self.source, go_file)
            raise LookupError(f"{name} is not a variable of {package.directory}")
        qualifier, member = name.split(".", 1)
        other = self.source.package_of_import(self.file.imports.get(qualifier, ""))
        if other is None or member not in other.variables:
            raise LookupError(f"cannot resolve {name}")
        tokens, index, go_file = other.variables[member]
        return parse_expression(tokens, index)[0], Scope(self.source, go_file)

    def call(self, call: Call) -> tuple[Any, Scope]:
        """The expression a call returns, and the scope its function body gives."""
        if "." in call.function:
            qualifier, name = call.function.split(".", 1)
            package = self.source.package_of_import(self.file.imports.get(qualifier, ""))
        else:
            package, name = self.file.package, call.function
        if package is None or name not in package.functions:
            raise LookupError(f"cannot follow the call to {call.function}")
        function = package.functions[name]
        bound = {p: (a, self) for p, a in zip(function.params, call.args, strict=False)}
        returned = _returned(function.body)
        return returned, Scope(self.source, function.file, function.body, bound)


def _local_assignment(body: list[Token], name: str) -> Any | None:
    for index in range(len(body) - 2):
        if (
            body[index].text == name
            and body[index + 1].text in (":=", "=")
            and (index == 0 or body[index - 1].text not in (".", ","))
        ):
            return parse_expression(body, index + 2)[0]
    return None


def _returned(body: list[Token]) -> Any:
    """The expression of the last top-level ``return`` of a function body."""
    depth = 0
    last = None
    for index, token in enumerate(body):
        if token.kind == "op" and token.text in _OPEN:
            depth += 1
        elif token.kind == "op" and token.text in (")", "}", "]"):
            depth -= 1
        elif token.text == "return" and depth == 0:
            last = index
    if last is None:
        raise LookupError("function without a top-level return")
    return parse_expression(body, last + 1)[0]


def _entries(node: Any, scope: Scope) -> tuple[Composite, Scope]:
    """Follow names and calls down to a composite literal."""
    for _ in range(20):
        if isinstance(node, Composite):
            return node, scope
        if isinstance(node, Name):
            node, scope = scope.resolve(node.text)
        elif isinstance(node, Call):
            node, scope = scope.call(node)
        else:
            break
    raise ValueError(f"cannot read a schema from {node}")


def schema_map(node: Any, scope: Scope) -> dict[str, Field]:
    """A ``map[string]*schema.Schema`` expression, evaluated."""
    while isinstance(node, Name):
        node, scope = scope.resolve(node.text)
    if isinstance(node, Call) and node.function.endswith("MergeSchemas"):
        merged: dict[str, Field] = {}
        for arg in node.args:
            merged.update(schema_map(arg, scope))
        return merged
    literal, scope = _entries(node, scope)
    if not literal.type.startswith("map"):
        raise ValueError(f"expected a schema map, found {literal.type}")
    out = {}
    for key, value in literal.entries:
        if key is None:
            raise ValueError("schema map entry without a key")
        out[json.loads(key)] = schema_field(value, scope)
    return out


def schema_field(node: Any, scope: Scope) -> Field:
    """A ``*schema.Schema`` expression, evaluated."""
    literal, scope = _entries(node, scope)
    entries = dict(literal.entries)
    kind = entries.get("Type")
    force_new = entries.get("ForceNew")
    if force_new is not None and not (isinstance(force_new, Name) and force_new.text in ("true", "false")):
        raise ValueError(f"ForceNew is not a constant: {force_new}")
    elem: dict[str, Field] | Field | None = None
    if "Elem" in entries:
        elem = schema_elem(entries["Elem"], scope)
    return Field(
        type=kind.text.rsplit(".", 1)[-1] if isinstance(kind, Name) else "",
        force_new=isinstance(force_new, Name) and force_new.text == "true",
        elem=elem,
    )


def schema_elem(node: Any, scope: Scope) -> dict[str, Field] | Field:
    """An ``Elem``: a block (``*schema.Resource``) or a plain element (``*schema.Schema``)."""
    literal, inner = _entries(node, scope)
    if literal.type.endswith("Resource"):
        return resource_schema(literal, inner)
    return schema_field(literal, inner)


def resource_schema(node: Any, scope: Scope) -> dict[str, Field]:
    """The ``Schema`` of a ``*schema.Resource`` expression, evaluated."""
    literal, scope = _entries(node, scope)
    if not literal.type.endswith("Resource"):
        raise ValueError(f"expected a schema.Resource, found {literal.type}")
    entries = dict(literal.entries)
    if "Schema" not in entries:
        raise ValueError("schema.Resource without a Schema")
    return schema_map(entries["Schema"], scope)


def force_new_paths(schema: dict[str, Field], prefix: str = "") -> Iterator[str]:
    """The ForceNew paths of a schema map, nested blocks included."""
    for name, entry in sorted(schema.items()):
        path = prefix + name
        if isinstance(entry.elem, dict):
            if entry.force_new:
                yield path + ".#"
            yield from force_new_paths(entry.elem, path + ".")
        elif entry.force_new:
            yield path


def all_paths(schema: dict[str, Field], prefix: str = "") -> Iterator[str]:
    """Every path of a schema map, as :func:`force_new_paths` would name it."""
    for name, entry in sorted(schema.items()):
        path = prefix + name
        yield path
        if isinstance(entry.elem, dict):
            yield path + ".#"
            yield from all_paths(entry.elem, path + ".")


# ----------------------------------------------------------------- CustomizeDiff


def customize_diff_functions(node: Any, scope: Scope) -> Iterator[tuple[str, str | None]]:
    """The CustomizeDiff functions of a resource, or those they call, that force replacement.

    Each comes as (function name, None), or for ``customdiff.ForceNewIf(Change)`` as (its name, the
    path it watches).
    """
    seen: set[int] = set()  # by id(); the resource's own constructor is read as its schema, not here
    constructor = _function(node, scope) if isinstance(node, Call) else None
    if constructor is not None:
        seen.add(id(constructor))
    literal, scope = _entries(node, scope)
    entries = dict(literal.entries)
    if "CustomizeDiff" not in entries:
        return
    pending: list[tuple[Any, Scope, int]] = [(entries["CustomizeDiff"], scope, 0)]
    while pending:
        current, where, depth = pending.pop()
        if isinstance(current, Call) and current.function in ("customdiff.All", "customdiff.Sequence"):
            pending.extend((arg, where, depth) for arg in current.args)
        elif isinstance(current, Call) and current.function.startswith("customdiff.ForceNewIf"):
            watched = current.args[0] if current.args else None
            path = json.loads(watched.text) if isinstance(watched, Literal) else str(watched)
            yield current.function, re.sub(r"\.[0-9]+(?=\.|$)", "", path)
        elif isinstance(current, (Name, Call)) and depth < 8:
            function = _function(current, where)
            if function is None and isinstance(current, Call):  # customdiff.If(...), the SDK's...
                pending.extend((arg, where, depth) for arg in current.args)
            if function is None or id(function) in seen:
                continue
            seen.add(id(function))
            name = current.function if isinstance(current, Call) else current.text
            callee_scope = Scope(where.source, function.file, function.body)
            if _calls_force_new(function.body):
                yield name.rsplit(".", 1)[-1], None
            pending.extend((Name(callee), callee_scope, depth + 1) for callee in _callees(function.body))


def _function(node: Name | Call, scope: Scope) -> Function | None:
    text = node.function if isinstance(node, Call) else node.text
    if "." in text:
        qualifier, name = text.split(".", 1)
        package = scope.source.package_of_import(scope.file.imports.get(qualifier, ""))
    else:
        package, name = scope.file.package, text
    if package is None:
        return None
    return package.functions.get(name)


def _callees(body: list[Token]) -> Iterator[str]:
    """The functions a body calls by name: ``f(...)`` and ``package.f(...)`` (not methods)."""
    for index in range(1, len(body) - 1):
        if body[index].kind != "name" or body[index + 1].text != "(":
            continue
        if body[index - 1].text != ".":
            yield body[index].text
        elif index >= 2 and body[index - 2].kind == "name" and (index < 3 or body[index - 3].text != "."):
            yield f"{body[index - 2].text}.{body[index].text}"  # resolved only if an import's name


def _calls_force_new(body: list[Token]) -> bool:
    """Whether a body calls ``d.ForceNew(...)``, or uses ``customdiff.ForceNewIf(Change)``."""
    for index in range(len(body) - 2):
        if [t.text for t in body[index : index + 3]] == [".", "ForceNew", "("]:
            return True
        if body[index].text in ("ForceNewIf", "ForceNewIfChange"):
            return True
    return False


# ----------------------------------------------------------------- the data file


@dataclass
class Extracted:
    """What one provider says about the wanted types."""

    force_new: dict[str, list[str]]
    paths: dict[str, set[str]]  # every path of each type, ForceNew or not
    missing: list[str]  # wanted types the provider has no resource for


def extract(source: Source, types: Iterable[str]) -> Extracted:
    """The ForceNew paths of the resource types among ``types`` that the provider has."""
    types = sorted(types)
    registered = source.registered_resources(types)
    out = Extracted({}, {}, [t for t in types if t not in registered])
    for type_name in types:
        if type_name not in registered:
            continue
        node, go_file = registered[type_name]
        scope = Scope(source, go_file)
        try:
            schema = resource_schema(node, scope)
            reviewed = CONDITIONAL.get(type_name, [])
            for function, path in customize_diff_functions(node, scope):
                if not any(e["function"] == function and path in (None, e["force_new"]) for e in reviewed):
                    what = function if path is None else f"{function}({path!r})"
                    raise ValueError(
                        f"{what} in the CustomizeDiff of {type_name} forces replacement: review it "
                        "and describe it in CONDITIONAL"
                    )
        except (LookupError, ValueError) as error:
            raise ValueError(f"{source.provider}: {type_name}: {error}") from error
        out.force_new[type_name] = list(force_new_paths(schema))
        out.paths[type_name] = set(all_paths(schema))
    return out


def _commit(root: Path) -> str:
    try:
        result = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown commit"
    return result.stdout.strip()


def build(sources: list[Source], types: set[str], version: str, refs: list[str]) -> dict[str, Any]:
    """The document written to ``force_new.json``.

    The lists are google-beta's (a superset of google's attributes). google gets a list of its own
    only for a type where it disagrees on an attribute both providers have.
    """
    extracted = {source.provider: extract(source, types) for source in sources}
    primary = extracted.get("google-beta") or next(iter(extracted.values()))
    merged = dict(primary.force_new)
    for found in extracted.values():
        for type_name, paths in found.force_new.items():
            merged.setdefault(type_name, paths)
    differences: dict[str, dict[str, list[str]]] = {}
    for provider, found in extracted.items():
        for type_name, paths in found.force_new.items():
            expected = [p for p in merged[type_name] if p in found.paths[type_name]]
            if paths != expected:
                differences.setdefault(provider, {})[type_name] = paths
    data_sources = set(types).intersection(*(found.missing for found in extracted.values()))
    document: dict[str, Any] = {
        "provider version": version,
        "source": [
            f"hashicorp/terraform-provider-{source.provider}@{ref}"
            for source, ref in zip(sources, refs, strict=True)
        ],
        "notes": [
            "Generated by `python -m tools.provider_stand_in.force_new`: do not edit by hand.",
            "resources: per type, the attributes whose change forces replacement (ForceNew in the "
            "provider's Go schema). Nested block attributes are joined with '.'; 'BLOCK.#' is the "
            "number of BLOCK blocks (a ForceNew block forces replacement only when blocks are added "
            "or removed; its attributes follow their own ForceNew). A ForceNew list, set or map of "
            "plain values forces replacement on any change of its elements.",
            "The lists hold google-beta's attributes; under 'provider differences', a provider's own "
            "list for a type where it disagrees on an attribute both providers have.",
            "conditional: CustomizeDiff functions that force replacement at plan time under a "
            "condition, reviewed by hand; the stand-in does not apply them.",
            "data sources: types the scanned modules name that neither provider has as a resource.",
        ],
        "resources": dict(sorted(merged.items())),
        "conditional": {t: CONDITIONAL[t] for t in sorted(CONDITIONAL) if t in merged},
        "data sources": sorted(data_sources),
        "provider differences": {p: dict(sorted(d.items())) for p, d in sorted(differences.items())},
    }
    return document


def main(argv: list[str] | None = None) -> int:
    """Regenerate ``force_new.json`` from provider checkouts; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m tools.provider_stand_in.force_new",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    parser.add_argument(
        "sources", type=Path, nargs="+", help="checkouts of terraform-provider-google(-beta), at the release"
    )
    parser.add_argument(
        "--ref",
        action="append",
        default=[],
        help="the tag, branch or commit of each checkout, in order (default: its git HEAD)",
    )
    parser.add_argument(
        "--provider-version",
        help="the provider version the stand-in serves (default: the one its cdktn package binds)",
    )
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    sources = [Source(path) for path in args.sources]
    refs = args.ref + [_commit(s.root) for s in sources[len(args.ref) :]]
    version = args.provider_version or provider_version(next(p for p in PROVIDERS if p.name == "google-beta"))
    try:
        document = build(sources, wanted_types(), version, refs)
    except ValueError as error:
        print(f"force_new: {error}", file=sys.stderr)
        return 1
    args.output.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {args.output}: {len(document['resources'])} resource types", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
