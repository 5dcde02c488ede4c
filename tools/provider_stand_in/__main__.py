"""Command line: ``python -m tools.provider_stand_in {env,run,schema}``; see ``--help``."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from tools.provider_stand_in.environment import (
    DEFAULT_CACHE_DIR,
    PROVIDERS,
    full_schema_dir,
    provider_version,
    terraform_env,
)

_EPILOG = """\
examples:
  eval "$(python -m tools.provider_stand_in env --scan terraform tests/terraform_fixtures)"
  terraform -chdir=terraform validate

  python -m tools.provider_stand_in run --scan terraform -- -chdir=terraform validate
  python -m tools.provider_stand_in run --scan terraform -- -chdir=terraform test
  python -m tools.provider_stand_in schema google_pubsub_topic

Do not run `terraform init` with this environment: dev_overrides need none, and init would try the
registry. The first use downloads two wheels from PyPI (about 140 MB) and rebuilds the schemas
(about 40 s); later uses take well under a second before terraform starts.
"""


def _scan_dirs(scan: list[Path] | None, terraform_args: list[str]) -> list[Path]:
    if scan:
        return scan
    for arg in terraform_args:
        if arg.startswith("-chdir="):
            return [Path(arg.split("=", 1)[1])]
    return [Path.cwd()]


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m tools.provider_stand_in",
        description="Run terraform offline against stand-in google and google-beta providers: the real "
        "providers' schemas (rebuilt from the cdktn packages on PyPI) with no cloud behind them. "
        "Terraform checks arguments, types and references against those schemas; the provider's own "
        "value checks (formats, enums, conflicts) are not run.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=DEFAULT_CACHE_DIR,
        help="where wheels, schemas and launchers are kept (default: <repo>/.cache/terraform)",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    env = commands.add_parser("env", help="print `export VAR=...` lines for a shell")
    env.add_argument(
        "--scan",
        type=Path,
        nargs="+",
        default=None,
        metavar="DIR",
        help="folders whose .tf/.tftest.hcl files name the resource types to serve (default: .)",
    )
    run = commands.add_parser(
        "run", help="run terraform with the stand-in providers: run [--scan DIR...] -- ARGS"
    )
    run.add_argument(
        "--scan",
        type=Path,
        nargs="+",
        default=None,
        metavar="DIR",
        help="folders to scan for resource types (default: the -chdir folder, else .)",
    )
    run.add_argument("terraform_args", nargs=argparse.REMAINDER, help="arguments for terraform, after --")
    schema = commands.add_parser("schema", help="print the schema the stand-in serves for one type")
    schema.add_argument("type_name", help="e.g. google_pubsub_topic (resource, else data source)")
    schema.add_argument("--provider", default="google", choices=[p.name for p in PROVIDERS])
    args = parser.parse_args(argv)

    if args.command == "env":
        variables = terraform_env(_scan_dirs(args.scan, []), args.cache_dir)
        for provider in PROVIDERS:
            print(
                f"# {provider.name}: schema of provider {provider_version(provider, args.cache_dir)} "
                f"({provider.package}=={provider.version})"
            )
        for name, value in variables.items():
            print(f"export {name}={shlex.quote(value)}")
        return 0
    if args.command == "schema":
        provider = next(p for p in PROVIDERS if p.name == args.provider)
        full = full_schema_dir(provider, args.cache_dir)
        for kind in ("resource_schemas", "data_source_schemas"):
            path = full / kind / f"{args.type_name}.json"
            if path.is_file():
                print(f"# {kind[:-8].replace('_', ' ')} {args.type_name}")
                print(json.dumps(json.loads(path.read_text()), indent=2))
                return 0
        print(f"{args.type_name}: no such resource or data source in {provider.name}", file=sys.stderr)
        return 1
    terraform_args = args.terraform_args[1:] if args.terraform_args[:1] == ["--"] else args.terraform_args
    terraform = shutil.which("terraform")
    if terraform is None:
        print("terraform is not on PATH", file=sys.stderr)
        return 127
    variables = terraform_env(_scan_dirs(args.scan, terraform_args), args.cache_dir)
    return subprocess.run([terraform, *terraform_args], env={**os.environ, **variables}).returncode


if __name__ == "__main__":
    sys.exit(main())
