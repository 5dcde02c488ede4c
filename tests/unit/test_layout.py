"""The layout the README promises: the pipeline in rooms by role, a core without Beam, and every
package named as it is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import tomllib

from support import REPO

PIPELINE = REPO / "pipeline"
PROJECTS = [REPO / folder / "pyproject.toml"
            for folder in (".", "emitter", "goodput_schemas", "ml_goodput_measurement")]
#: Besides its subpackages, what the top of ``pipeline/`` may hold.
ENTRY_POINTS = {"__init__.py", "__main__.py", "py.typed"}


def imported_modules(path: Path, anywhere: bool = True) -> set[str]:
    """The modules a source file imports: anywhere in it (in functions too), or when imported."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree) if anywhere else tree.body:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def source_of(module: str) -> Path | None:
    """The file of one of this repository's modules (the tests' ``support`` too), or None."""
    for root in (REPO, REPO / "tests"):
        path = root.joinpath(*module.split("."))
        if path.with_suffix(".py").is_file():
            return path.with_suffix(".py")
        if (path / "__init__.py").is_file():
            return path / "__init__.py"
    return None


def beam_imports(*roots: Path) -> list[str]:
    """Where the files ``roots`` (anywhere in them) or this repository's modules that they import
    (when imported, in turn) import Apache Beam or the pipeline's Beam room."""
    found, seen, todo = [], set(), list(roots)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for module in imported_modules(path, anywhere=path in roots):
            if module.startswith(("apache_beam", "pipeline.beam")):
                found.append(f"{path.relative_to(REPO)} imports {module}")
            source = source_of(module)
            if source is not None:
                todo.append(source)
    return found


def test_the_top_of_pipeline_holds_only_rooms_and_entry_points():
    """Every module of the pipeline lives in a room named for its role."""
    loose = sorted(p.name for p in PIPELINE.iterdir() if p.is_file() and p.name not in ENTRY_POINTS)
    assert loose == []
    rooms = {p.name for p in PIPELINE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert rooms == {"core", "beam", "sinks", "emulators", "app", "demo"}


def test_the_core_imports_nothing_of_beam_however_deep():
    """The parser and the engine, and everything they import in turn, run without Apache Beam."""
    assert beam_imports(*(PIPELINE / "core").glob("*.py")) == []


def test_the_unit_tier_imports_nothing_of_beam_however_deep():
    """tests/unit runs without Beam: its tests, its fixtures and what they import."""
    tests = REPO / "tests"
    assert beam_imports(tests / "conftest.py", *(tests / "unit").glob("*.py")) == []


def test_every_distribution_builds_its_package_from_the_folder_of_that_name():
    """Four distributions, each the package in its own folder: no package is renamed on install."""
    found = {}
    for project in PROJECTS:
        config = tomllib.loads(project.read_text())
        setuptools = config["tool"]["setuptools"]
        packages = setuptools["packages"]
        if isinstance(packages, dict):  # found: the pipeline's subpackages
            packages = packages["find"]["include"]
        for package, folder in setuptools.get("package-dir", {}).items():
            assert (project.parent / folder).resolve() == (REPO / package).resolve(), (project, package)
        found[config["project"]["name"]] = packages
    assert found == {"fleet-goodput": ["pipeline", "pipeline.*"], "fleet-goodput-emitter": ["emitter"],
                     "fleet-goodput-schemas": ["goodput_schemas", *(f"goodput_schemas.{data}" for data in (
                         "sql", "tables", "views"))],  # with its data folders, declared
                     "fleet-goodput-measurement": ["ml_goodput_measurement", "ml_goodput_measurement.src"]}


def test_the_distributions_share_one_version():
    """The distributions, and the version the emitter reports, move together."""
    from emitter import __version__

    versions = {tomllib.loads(path.read_text())["project"]["version"] for path in PROJECTS}
    assert versions == {__version__}
