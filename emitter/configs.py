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
whose value is over ``MAX_CONFIG_VALUE_LENGTH`` characters or not valid Unicode, whose key (or
text) cannot be had, that lies deeper than ``MAX_DEPTH`` containers, or that is a container
holding itself (a cycle: the entry that repeats it); an entry whose flattened key another entry
had already (``{"a.b": 1, "a": {"b": 2}}``: the first is kept); and past ``MAX_CONFIG_ENTRIES``
valid entries, the rest: the first ones in the mapping's own order (depth first) are kept, so
the same configuration always keeps the same entries. The walk is bounded whatever the
configuration: once the entries are full, or ``MAX_WALK`` entries and containers were looked at,
the rest is only counted, each container once (a list holding another twice, 40 levels deep,
is 2**40 entries to count, not to walk).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from goodput_schemas.limits import MAX_CONFIG_ENTRIES, configs_problem

#: Containers nested deeper than this are not walked: their entries are dropped.
MAX_DEPTH = 32
#: Entries and containers a walk looks at, at most: past them, the rest is only counted.
MAX_WALK = 10 * MAX_CONFIG_ENTRIES


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
    if configs:
        _Walk(fitted).visit("", configs, 0)
    return fitted


class _Walk:
    """One depth-first walk of a configuration into ``fitted``."""

    def __init__(self, fitted: Fitted) -> None:
        self.fitted = fitted
        self.path: set[int] = set()  # the containers being walked: one met again is a cycle
        self.counted: dict[int, int] = {}  # entries under each container counted so far
        self.walked = 0

    def visit(self, key: str, value: object, depth: int) -> None:
        fitted = self.fitted
        self.walked += 1
        if len(fitted.values) >= MAX_CONFIG_ENTRIES:
            fitted.drop(self.count(value), f"more than MAX_CONFIG_ENTRIES ({MAX_CONFIG_ENTRIES}) entries")
        elif self.walked > MAX_WALK:
            fitted.drop(self.count(value), f"more than MAX_WALK ({MAX_WALK}) entries and containers "
                                           "to look at")
        elif not isinstance(value, (Mapping, list, tuple)):
            self.leaf(key, value)
        elif id(value) in self.path:
            fitted.drop(1, f"{key[:80]!r} is a container holding itself")
        elif depth > MAX_DEPTH:
            fitted.drop(self.count(value), f"{key[:80]!r} is nested deeper than MAX_DEPTH ({MAX_DEPTH}) "
                                           "containers")
        elif not value:
            self.leaf(key, "{}" if isinstance(value, Mapping) else "[]")
        else:
            self.path.add(id(value))
            try:
                for name, item in _items(value):
                    if name is None:
                        fitted.drop(self.count(item), f"a key under {key[:80]!r} has no text")
                    else:
                        self.visit(f"{key}.{name}" if key else name, item, depth + 1)
            finally:
                self.path.discard(id(value))

    def leaf(self, key: str, value: object) -> None:
        fitted = self.fitted
        if key in fitted.values:
            fitted.drop(1, f"the flattened key {key[:80]!r} is given twice; the first is kept")
            return
        try:
            text = config_text(value)
        except Exception as error:  # noqa: BLE001 - a user's __str__ (or an int of 5,000 digits)
            fitted.drop(1, f"the value of {key[:80]!r} has no text: {type(error).__name__}: {error}")
            return
        problem = configs_problem("user", {key: text})
        if problem is not None:
            fitted.drop(1, problem)
            return
        fitted.values[key] = text

    def count(self, value: object) -> int:
        """How many entries ``value`` holds, each container counted once (a cycle: one)."""
        if not isinstance(value, (Mapping, list, tuple)) or not value:
            return 1
        known = self.counted.get(id(value))
        if known is not None:
            return known
        self.counted[id(value)] = 1  # met again while counting it: the cycle's one entry
        total = sum(self.count(item) for _, item in _items(value))
        self.counted[id(value)] = total
        return total


def _items(value: Mapping[Any, Any] | list[Any] | tuple[Any, ...]) -> Iterator[tuple[str | None, object]]:
    """(key as text, or None where it has none; item) of a container, in its own order."""
    if not isinstance(value, Mapping):
        yield from ((str(index), item) for index, item in enumerate(value))
        return
    for key, item in value.items():
        try:
            yield (key if isinstance(key, str) else config_text(key)), item
        except Exception:  # noqa: BLE001 - a key whose __str__ raises
            yield None, item
