"""One option style, the other accepted: every long option of every command may be written with
underscores or with hyphens between its words, whichever its parser declares.

The canonical style is underscores (``--bigquery_dataset``), the style of the pipeline's options
and of Beam's own, which ``python -m pipeline`` and ``goodput replay`` take beside them; a few
options of the commands are declared with hyphens (``goodput demo --output-dir``). Either is
accepted for any of them: ``--output_dir`` and ``--bigquery-dataset`` are the same options.
Abbreviations are accepted nowhere (``--bigquery`` for ``--bigquery_dataset``): an option is
named whole, so that adding an option never changes what an old command line means.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

#: What ``--help`` says of the spelling, in the commands' epilogs.
SPELLING_HELP = ("Options may be written with underscores (--bigquery_dataset, as shown) or hyphens "
                 "(--bigquery-dataset); abbreviations are not accepted.")


def _key(option: str) -> str:
    return option.replace("-", "_")


def respell(argv: Sequence[str], options: Iterable[str]) -> list[str]:
    """``argv`` with each long option (``--a-b``, ``--a_b``, ``--a-b=VALUE``) spelled as in
    ``options``, the option strings a parser declares; anything else, and everything after ``--``,
    as it was. An option no parser knows is left for the parser to refuse, by the name given."""
    declared = {_key(option): option for option in options if option.startswith("--")}
    respelled: list[str] = []
    for position, arg in enumerate(argv):
        if arg == "--":
            return respelled + list(argv[position:])
        name, equals, value = arg.partition("=")
        if name.startswith("--") and len(name) > 2:
            name = declared.get(_key(name), name)
        respelled.append(name + equals + value)
    return respelled
