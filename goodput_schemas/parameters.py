"""The parameters of the saved fleet queries: values a user changes without editing SQL.

A saved query names a parameter as BigQuery does, ``@name``, and declares it in its header
comment, one line each, with its type and default as a BigQuery literal::

    -- @interval_hours INT64 = 1: the interval's length, in hours

The SQL a command prints or runs has every parameter replaced by a literal (its default, or the
value given, e.g. ``goodput query interval_goodput --param interval_hours=6``), so it runs as it
is in the BigQuery console, in ``bq query`` and, transpiled, on DuckDB: nothing is declared. The
file itself, with its ``@name`` left in, runs with ``bq query --parameter=name:TYPE:VALUE``.
"""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

#: A declaration in a query's header comment: ``-- @name TYPE = DEFAULT: what it is``.
_DECLARATION = re.compile(r"^--\s*@(?P<name>[a-z_][a-z0-9_]*)\s+(?P<type>[A-Z0-9]+)\s*=\s*"
                          r"(?P<default>'(?:[^'\\]|\\.)*'|[^\s:]+)\s*:\s*(?P<help>.+)$", re.MULTILINE)
#: A parameter where the SQL uses one: ``@name``, not ``@@name`` nor inside a word.
_USE = re.compile(r"(?<![\w@])@(?P<name>[A-Za-z_]\w*)")
TYPES = ("INT64", "FLOAT64", "STRING", "BOOL", "DATE")


@dataclass(frozen=True)
class Parameter:
    """A saved query's parameter: ``name``, its BigQuery ``type``, its ``default`` as a BigQuery
    literal (``NULL`` for none) and what it is (``help``)."""

    name: str
    type: str
    default: str
    help: str

    def literal(self, text: str) -> str:
        """``text`` from a command line as a BigQuery literal of this parameter's type (``NULL``
        as itself); ``ValueError`` saying what a value of the type looks like."""
        if text.upper() == "NULL":
            return "NULL"
        if self.type == "INT64":
            if not re.fullmatch(r"-?\d{1,18}", text):
                raise ValueError(f"{self.name} is a whole number, got {text!r}")
            return str(int(text))
        if self.type == "FLOAT64":
            try:
                number = float(text)
            except ValueError:
                raise ValueError(f"{self.name} is a number, got {text!r}") from None
            if not math.isfinite(number):
                raise ValueError(f"{self.name} is a finite number, got {text!r}")
            return repr(number)
        if self.type == "BOOL":
            if text.lower() not in ("true", "false"):
                raise ValueError(f"{self.name} is true or false, got {text!r}")
            return text.upper()
        if self.type == "DATE":
            try:
                return f"DATE '{datetime.date.fromisoformat(text).isoformat()}'"
            except ValueError:
                raise ValueError(f"{self.name} is a date, YYYY-MM-DD, got {text!r}") from None
        escaped = text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n").replace("\r", "\\r")
        return f"'{escaped}'"

    def sql(self, literal: str) -> str:
        """A literal of this parameter as the SQL puts it where ``@name`` was: a NULL keeps the
        parameter's type, as a BigQuery parameter's would."""
        return f"CAST(NULL AS {self.type})" if literal == "NULL" else literal


def parameters(sql: str) -> dict[str, Parameter]:
    """The parameters ``sql`` declares, by name, in the order declared; ``ValueError`` if one is
    of a type not supported here, or the SQL uses one it does not declare."""
    found = {match["name"]: Parameter(match["name"], match["type"], match["default"], match["help"].strip())
             for match in _DECLARATION.finditer(sql)}
    for parameter in found.values():
        if parameter.type not in TYPES:
            raise ValueError(f"parameter @{parameter.name} is of type {parameter.type}, not one of "
                             f"{', '.join(TYPES)}")
    undeclared = {match["name"] for match in _USE.finditer(_body(sql))} - set(found)
    if undeclared:
        raise ValueError(f"the query uses {', '.join('@' + name for name in sorted(undeclared))} "
                         "without declaring it in its header (-- @name TYPE = DEFAULT: what it is)")
    return found


def fill(sql: str, values: Mapping[str, str] | None = None) -> str:
    """``sql`` with each parameter replaced by a literal: the value given in ``values`` (by name,
    as text from a command line), else its default. ``ValueError`` for a name the query does not
    declare, or a value that is not of the parameter's type, naming the valid ones."""
    declared = parameters(sql)
    values = dict(values or {})
    unknown = [name for name in values if name not in declared]
    if unknown:
        valid = ", ".join(declared) if declared else "none"
        raise ValueError(f"no parameter {unknown[0]!r} (this query's parameters: {valid})")
    literals = {name: parameter.literal(values[name]) if name in values else parameter.default
                for name, parameter in declared.items()}
    header, body = _split(sql)
    return header + _USE.sub(lambda match: declared[match["name"]].sql(literals[match["name"]]), body)


def _split(sql: str) -> tuple[str, str]:
    """The query's header (its leading comment lines, where parameters are declared) and the rest."""
    lines = sql.splitlines(keepends=True)
    position = next((i for i, line in enumerate(lines) if not line.startswith("--")), len(lines))
    return "".join(lines[:position]), "".join(lines[position:])


def _body(sql: str) -> str:
    """The query without its header, nor any comment (a ``@`` in prose is no parameter)."""
    return re.sub(r"--[^\n]*", "", _split(sql)[1])
