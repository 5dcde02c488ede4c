"""A run's configuration as a ``configs`` event holds it: flat dotted keys, each value as text.

``GoodputRecorder.record_configs`` takes a job's own configuration, flat or nested::

    recorder.record_configs({"model": {"layers": 32, "dtype": "bfloat16"},
                             "optimizer": {"learning_rate": 3e-4, "betas": (0.9, 0.95)}})

and records ``model.layers = "32"``, ``model.dtype = "bfloat16"``, ``optimizer.learning_rate =
"0.0003"``, ``optimizer.betas.0 = "0.9"``, ``optimizer.betas.1 = "0.95"``. Mappings and lists or
tuples are walked (an empty one is the value ``"{}"`` or ``"[]"``); every other value becomes
text: ``True`` is ``"true"``, ``None`` is ``"null"``, a number is its shortest round-tripping
form (``repr``, or a numpy scalar's own ``str``), a string stays as it is, anything else is
``str(value)``. ``emitter.collect`` records the emitter's own configs the same way.

What the contract's limits refuse is dropped, counted and logged, never raised (but by a strict
recorder): an entry whose key is not a printable name of at most ``MAX_TEXT_LENGTH`` characters,
whose value is over ``MAX_CONFIG_VALUE_LENGTH`` characters or not valid Unicode, or that lies
deeper than ``MAX_DEPTH`` containers (a mapping that contains itself); and past
``MAX_CONFIG_ENTRIES`` valid entries, the rest: the first ones in the mapping's own order (depth
first) are kept, so the same configuration always keeps the same entries.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from goodput_schemas.limits import MAX_CONFIG_ENTRIES, configs_problem

#: Containers nested deeper than this are not walked: their entries are dropped.
MAX_DEPTH = 32


class Fitted:
    """The entries of one ``configs`` event, and what was dropped to fit the limits.

    Attributes:
        values: Dotted key -> text, within the contract's limits.
        dropped: Entries left out.
        reason: Why the first of them was left out, for the log.
    """

    __slots__ = ("dropped", "reason", "values")

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.dropped = 0
        self.reason = ""

    def drop(self, count: int, reason: str) -> None:
        self.dropped += count
        self.reason = self.reason or reason


def config_text(value: object) -> str:
    """A config value as text (see the module docstring)."""
    if isinstance(value, str):
        return value
    if value is None:
        return "null"
    if isinstance(value, bool) or type(value).__name__ in ("bool_", "bool"):  # numpy's too
        return "true" if value else "false"
    if type(value) is float:
        return repr(value)
    return str(value)


def fit_configs(configs: Mapping[Any, Any]) -> Fitted:
    """The entries of ``configs``, flattened and fitted to the limits of one ``configs`` event."""
    fitted = Fitted()
    if not configs:
        return fitted
    for key, value in _leaves("", configs, 0, fitted):
        if len(fitted.values) >= MAX_CONFIG_ENTRIES:
            fitted.drop(1, f"more than MAX_CONFIG_ENTRIES ({MAX_CONFIG_ENTRIES}) entries")
            continue
        try:
            text = config_text(value)
        except Exception as error:  # noqa: BLE001 - a user's __str__ (or an int of 5,000 digits)
            fitted.drop(1, f"the value of {key[:80]!r} has no text: {type(error).__name__}: {error}")
            continue
        problem = configs_problem("user", {key: text})
        if problem is not None:
            fitted.drop(1, problem)
            continue
        fitted.values[key] = text
    return fitted


def _leaves(prefix: str, value: object, depth: int, fitted: Fitted) -> Iterator[tuple[str, object]]:
    """(dotted key, leaf value) of every entry, depth first, in the containers' own order."""
    if not isinstance(value, (Mapping, list, tuple)):
        yield prefix, value
        return
    if depth > MAX_DEPTH:
        fitted.drop(1, f"{prefix[:80]!r} is nested deeper than MAX_DEPTH ({MAX_DEPTH}) containers")
        return
    if not value:
        yield prefix, "{}" if isinstance(value, Mapping) else "[]"
        return
    items = value.items() if isinstance(value, Mapping) else enumerate(value)
    for key, item in items:
        name = key if isinstance(key, str) else config_text(key)
        yield from _leaves(f"{prefix}.{name}" if prefix else name, item, depth + 1, fitted)
