"""Builds the emitter's compiled fast path, ``emitter._lane`` (``_lane.c``), where a C compiler is
at hand; where it is not, the build goes on without it and the emitter uses the same code in
Python (``emitter/lane.py``). Everything else is in ``pyproject.toml``."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("emitter._lane", ["_lane.c"], optional=True)])
