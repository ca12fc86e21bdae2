"""Load a file of ``scripts/`` as a module, to call its functions or ``main(argv)`` in-process."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Optional, Union

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(script: Union[str, Path], module_name: Optional[str] = None, register: bool = False) -> ModuleType:
    """``scripts/<script>.py`` (or a path) executed as a fresh module named ``module_name`` (default: the file's
    stem); ``register`` also puts it in ``sys.modules`` (for scripts whose dataclasses or pickles look themselves up
    there)."""
    path = Path(script) if Path(script).suffix == ".py" else SCRIPTS / f"{script}.py"
    spec = importlib.util.spec_from_file_location(module_name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module
