"""diffusers-var-accel: Infinity and HART next-scale (VAR) text-to-image models in the style of Diffusers, with
training-free acceleration schedulers.

Submodules are imported eagerly: diffusers 0.42 resolves the classes named in ``model_index.json`` only from modules
that are already imported.
"""

from .version import __version__  # noqa: F401  (a leaf module: hub.py and setup.py read it there)

from .models.autoencoder_bsq import InfinityBSQVAE
from .models.autoencoder_hart import HARTHybridTokenizer
from .next_scale.cache import ScaleKVCache
from .next_scale.context import VARForwardContext
from .models.infinity_resolutions import infinity_scale_schedule, schedule_for_size, supported_sizes
from .models.transformer_hart import HART_CONFIGS, HARTTransformer
from .models.transformer_infinity import INFINITY_CONFIGS, InfinityTransformer
from .pipelines.hart.pipeline_hart import HARTPipeline
from .pipelines.infinity.pipeline_infinity import InfinityPipeline
from .next_scale import NextScaleState, run_next_scale_loop
from .schedulers.scheduling_arvar import ARVARScheduler
from .schedulers.scheduling_depthvar import DepthVARScheduler
from .schedulers.scheduling_fastvar import FastVARScheduler
from .schedulers.scheduling_lazyvar import LazyVARScheduler
from .schedulers.scheduling_stagevar import StageVARScheduler
from .schedulers.composition import ComposedScheduler
from .schedulers.identity import IdentityScheduler
from .schedulers.scheduling_var_base import ScalePlan, VARAccelScheduler
from .pipelines.diffusers_registration import register_pipelines_with_diffusers

from .families import MODEL_FAMILIES  # noqa: E402

# DiffusionPipeline / AutoPipelineForText2Image.from_pretrained(folder) resolve "_class_name" by name in diffusers
register_pipelines_with_diffusers(*(family.pipeline_class() for family in MODEL_FAMILIES.values()))

# model_index.json may name this package as the library of a component (["diffusers_var_accel", "InfinityTransformer"]):
# diffusers then recognises a loadable class by looking its base classes up in that module, so the package holds them
from diffusers import ModelMixin  # noqa: E402,F401  (not in __all__)

__all__ = [
    "ARVARScheduler",
    "DepthVARScheduler",
    "FastVARScheduler",
    "HARTHybridTokenizer",
    "HARTPipeline",
    "HARTTransformer",
    "HART_CONFIGS",
    "INFINITY_CONFIGS",
    "ComposedScheduler",
    "IdentityScheduler",
    "InfinityBSQVAE",
    "InfinityPipeline",
    "InfinityTransformer",
    "LazyVARScheduler",
    "StageVARScheduler",
    "NextScaleState",
    "ScaleKVCache",
    "ScalePlan",
    "VARAccelScheduler",
    "VARForwardContext",
    "infinity_scale_schedule",
    "run_next_scale_loop",
    "schedule_for_size",
    "supported_sizes",
]
