"""Stand-in ``hashicorp/google`` and ``hashicorp/google-beta`` providers for offline Terraform checks.

No Terraform provider can be downloaded here, so ``terraform validate`` and ``terraform test`` would
stop at "Missing required provider". This package serves the real providers' schemas from a small
Python plugin instead:

* the schemas are rebuilt from the JavaScript bindings inside the PyPI packages
  ``cdktn-provider-google`` and ``cdktn-provider-google-beta`` (:mod:`.cdktn_schema`), cached, and
  pruned to the resource and data source types the scanned ``.tf``/``.tftest.hcl`` files name
  (:mod:`.environment`);
* :mod:`.server` speaks Terraform's plugin protocol 6 (go-plugin handshake, gRPC, TLS);
* :func:`terraform_env` gives the environment (a CLI config with ``dev_overrides``) to run terraform
  with; ``python -m tools.provider_stand_in --help`` does the same from a shell.

What it checks: unknown arguments and blocks, attribute types, required arguments, block counts
(``max_items = 1``, required blocks), references to attributes that do not exist, unknown resource
and data source types; with ``terraform test``, assertions over planned values (with or without
``mock_provider``). Against a state, a plan replaces a resource where the real provider would: when
an attribute it marks ``ForceNew`` changes (``force_new.json``, read from the provider's Go source
by :mod:`.force_new`); replacements its ``CustomizeDiff`` functions decide are only described
there. What it does not: the provider's own value validation (formats, enums, conflicting
arguments), defaults the provider would plan, descriptions, deprecation and sensitivity, provider
functions and ephemeral resources, and of course any real API call. Computed attributes come out
as ``stand-in-NAME`` strings, 0, false or empty collections after apply.
"""

from tools.provider_stand_in.environment import PROVIDERS, referenced_types, terraform_env

__all__ = ["PROVIDERS", "referenced_types", "terraform_env"]
