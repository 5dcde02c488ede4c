"""Developer tooling of the repository (not part of the installed packages)."""
