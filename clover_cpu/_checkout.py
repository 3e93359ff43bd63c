"""`import clover_cpu` from a source checkout: the repository root holds this package's source folder but
not its compiled extension (`pip install .` builds that into the installed copy), and Python puts the
working directory first on sys.path, so the source folder shadows the installed package. The import is
handed over to the installed copy, whose Python files and extension belong together."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path


def installed_copy(name: str, source_init: str, missing: ImportError):
    """Import the installed package `name` (another folder on sys.path than the one holding
    `source_init`), register it in sys.modules in place of the source folder's and return it; raise
    ImportError saying what to do when there is none."""
    here = Path(source_init).resolve().parent
    for entry in sys.path:
        try:
            base = Path(entry or ".").resolve()
        except OSError:
            continue
        if base == here.parent:
            continue
        spec = importlib.machinery.PathFinder.find_spec(name, [str(base)])
        if spec is None or spec.origin is None or Path(spec.origin).resolve().parent == here:
            continue
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        return module
    raise ImportError(f"{name}'s compiled extension is not in {here}: install the package with `pip install .` "
                      f"(it builds the extension) and import it from outside the source folder") from missing
