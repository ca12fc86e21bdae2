"""diffusers-var-accel: Infinity and HART next-scale (VAR) text-to-image models in the style of Diffusers, with
training-free acceleration schedulers.

The package imports lazily, as diffusers does: ``import diffusers_var_accel`` costs no torch, so ``var-accel --help``
answers at once. The first public name asked for (``from diffusers_var_accel import InfinityPipeline``) loads the
library as a whole, as an eager import did: every public module, and the pipelines registered with diffusers. The
library is also loaded as soon as diffusers is imported (before or after this package), because diffusers 0.42
resolves the classes named in ``model_index.json`` only from modules that are already imported and looks a plain
``"_class_name": "InfinityPipeline"`` up in its own namespace (``pipelines/diffusers_registration.py``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from typing import TYPE_CHECKING, Any, Dict, List

from .version import __version__  # noqa: F401  (a leaf module: hub.py and setup.py read it there)

#: ``{public name: module that defines it}`` (relative to the package), in the order an eager import loaded them.
_PUBLIC_NAMES: Dict[str, str] = {
    "InfinityBSQVAE": ".models.autoencoder_bsq",
    "HARTHybridTokenizer": ".models.autoencoder_hart",
    "ScaleKVCache": ".next_scale.cache",
    "VARForwardContext": ".next_scale.context",
    "infinity_scale_schedule": ".models.infinity_resolutions",
    "schedule_for_size": ".models.infinity_resolutions",
    "supported_sizes": ".models.infinity_resolutions",
    "HART_CONFIGS": ".models.transformer_hart",
    "HARTTransformer": ".models.transformer_hart",
    "INFINITY_CONFIGS": ".models.transformer_infinity",
    "InfinityTransformer": ".models.transformer_infinity",
    "HARTPipeline": ".pipelines.hart.pipeline_hart",
    "InfinityPipeline": ".pipelines.infinity.pipeline_infinity",
    "NextScaleState": ".next_scale",
    "run_next_scale_loop": ".next_scale",
    "ARVARScheduler": ".schedulers.scheduling_arvar",
    "DepthVARScheduler": ".schedulers.scheduling_depthvar",
    "FastVARScheduler": ".schedulers.scheduling_fastvar",
    "LazyVARScheduler": ".schedulers.scheduling_lazyvar",
    "StageVARScheduler": ".schedulers.scheduling_stagevar",
    "ComposedScheduler": ".schedulers.composition",
    "IdentityScheduler": ".schedulers.identity",
    "ScalePlan": ".schedulers.scheduling_var_base",
    "VARAccelScheduler": ".schedulers.scheduling_var_base",
}

#: Not in ``__all__``: ``model_index.json`` may name this package as the library of a component
#: (``["diffusers_var_accel", "InfinityTransformer"]``); diffusers then recognises a loadable class by looking its base
#: classes up in that module, so the package holds them.
_DIFFUSERS_BASES = ("ModelMixin",)

__all__ = sorted(_PUBLIC_NAMES)

_loaded = False


def _load_library() -> None:
    """Import every public module and register the pipelines with diffusers (once)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    namespace = globals()
    for name, module in _PUBLIC_NAMES.items():
        namespace[name] = getattr(importlib.import_module(module, __name__), name)
    from diffusers import ModelMixin

    from .families import MODEL_FAMILIES
    from .pipelines.diffusers_registration import register_pipelines_with_diffusers

    namespace["ModelMixin"] = ModelMixin
    # DiffusionPipeline / AutoPipelineForText2Image.from_pretrained(folder) resolve "_class_name" by name in diffusers
    register_pipelines_with_diffusers(*(family.pipeline_class() for family in MODEL_FAMILIES.values()))


def __getattr__(name: str) -> Any:
    if name in _PUBLIC_NAMES or name in _DIFFUSERS_BASES:
        _load_library()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_PUBLIC_NAMES) | set(_DIFFUSERS_BASES))


def _inside_an_import_of_this_package() -> bool:
    """Whether a module of this package is being imported now (loading the library then would meet it half-made)."""
    prefix = __name__ + "."
    for name, module in list(sys.modules.items()):
        if name == __name__ or name.startswith(prefix):
            spec = getattr(module, "__spec__", None)
            if spec is not None and getattr(spec, "_initializing", False) and name != __name__:
                return True
    return False


class _LoadAfterDiffusers(importlib.abc.MetaPathFinder):
    """Loads the library right after diffusers itself is imported, unless a module of this package is importing it
    (then the library's own imports, or the first public name asked for, load it)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "diffusers":
            return None
        sys.meta_path.remove(self)  # the real finders locate diffusers; this hook is done after one use
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_load(module) -> None:
            exec_module(module)
            if not _inside_an_import_of_this_package():
                _load_library()

        spec.loader.exec_module = exec_then_load
        return spec


if "diffusers" in sys.modules:
    _load_library()
else:
    sys.meta_path.insert(0, _LoadAfterDiffusers())

if TYPE_CHECKING:  # what static tools see: the names as an eager import defines them
    from diffusers import ModelMixin  # noqa: F401

    from .models.autoencoder_bsq import InfinityBSQVAE  # noqa: F401
    from .models.autoencoder_hart import HARTHybridTokenizer  # noqa: F401
    from .models.infinity_resolutions import infinity_scale_schedule, schedule_for_size, supported_sizes  # noqa: F401
    from .models.transformer_hart import HART_CONFIGS, HARTTransformer  # noqa: F401
    from .models.transformer_infinity import INFINITY_CONFIGS, InfinityTransformer  # noqa: F401
    from .next_scale import NextScaleState, run_next_scale_loop  # noqa: F401
    from .next_scale.cache import ScaleKVCache  # noqa: F401
    from .next_scale.context import VARForwardContext  # noqa: F401
    from .pipelines.hart.pipeline_hart import HARTPipeline  # noqa: F401
    from .pipelines.infinity.pipeline_infinity import InfinityPipeline  # noqa: F401
    from .schedulers.composition import ComposedScheduler  # noqa: F401
    from .schedulers.identity import IdentityScheduler  # noqa: F401
    from .schedulers.scheduling_arvar import ARVARScheduler  # noqa: F401
    from .schedulers.scheduling_depthvar import DepthVARScheduler  # noqa: F401
    from .schedulers.scheduling_fastvar import FastVARScheduler  # noqa: F401
    from .schedulers.scheduling_lazyvar import LazyVARScheduler  # noqa: F401
    from .schedulers.scheduling_stagevar import StageVARScheduler  # noqa: F401
    from .schedulers.scheduling_var_base import ScalePlan, VARAccelScheduler  # noqa: F401
