"""The repository's scripts in benchmarks/ (docgen, results, sample_path), importable by tests.

They are tools beside the package, not modules of it: loaded from their files, once per process,
and registered under their own name so that their dataclasses and pickling find them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load_script(name: str) -> ModuleType:
    """benchmarks/NAME.py as a module (the same object on every call)."""
    key = f"benchmarks_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, BENCHMARKS / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[key]
            raise
    return sys.modules[key]
