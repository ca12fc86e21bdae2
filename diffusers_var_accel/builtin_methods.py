"""The names of the library's own acceleration methods, readable without importing torch.

The registry (:mod:`diffusers_var_accel.schedulers.registry`) is where methods live: a scheduler class registers
itself when its module is imported, and that imports torch. The command line's ``--help`` only needs the names, so
they are listed here, in the registry's order (``tests/library/test_lazy_import.py`` checks that the two agree).
A method registered by a plugin appears in the registry only.
"""

from __future__ import annotations

from typing import Dict

#: ``{method name: its paper's name}`` of the five built-in methods, in registration order.
BUILTIN_METHODS: Dict[str, str] = {
    "fastvar": "FastVAR",
    "lazyvar": "LazyVAR",
    "depthvar": "DepthVAR",
    "arvar": "ARVAR",
    "stagevar": "StageVAR",
}
