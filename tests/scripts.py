"""The project's scripts (``benchmarks/``, ``examples/``) as modules, for tests that call their functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(path: Path, name: str | None = None) -> ModuleType:
    """The script at ``path`` run as the module ``name`` (default: its file's stem), registered in ``sys.modules``
    first (dataclasses look their module up while the class is built)."""
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
