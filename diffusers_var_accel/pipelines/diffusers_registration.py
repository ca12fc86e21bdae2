"""Make a folder written by ``save_pretrained`` load through diffusers' generic entry points.

diffusers 0.42 has no plug-in API for pipelines that live outside its tree. Its generic loaders resolve a plain
``"_class_name": "InfinityPipeline"`` of ``model_index.json`` by name only:

* ``DiffusionPipeline.from_pretrained`` does ``getattr(diffusers, _class_name)``
  (``pipelines/pipeline_loading_utils.py: _get_pipeline_class``);
* ``AutoPipelineForText2Image.from_pretrained`` looks the name up among the classes of
  ``diffusers.pipelines.auto_pipeline.AUTO_TEXT2IMAGE_PIPELINES_MAPPING``.

The only other route, custom code (``custom_pipeline=`` or ``"_class_name": [file, class]`` with a ``.py`` in the
folder, as our Hub shim does), always needs ``trust_remote_code=True``. So importing ``diffusers_var_accel`` adds its
two pipeline classes under their own names to the ``diffusers`` and ``diffusers.pipelines`` namespaces and to the
text-to-image mapping (the mapping when diffusers first imports ``auto_pipeline``, which it does lazily: importing it
eagerly costs ~0.7 s and transformers' warnings). Nothing of diffusers is replaced: a name diffusers already defines is left alone.
The package must be imported before loading, as diffusers 0.42 requires anyway for the component classes named in
``model_index.json`` (it resolves them only from already-imported modules).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Dict, Type

from diffusers.utils import logging

from ..families import MODEL_FAMILIES

logger = logging.get_logger(__name__)

_AUTO_PIPELINE_MODULE = "diffusers.pipelines.auto_pipeline"

#: Keys of our pipelines in ``AUTO_TEXT2IMAGE_PIPELINES_MAPPING`` (diffusers keys it by model name):
#: ``{pipeline class name: "<family>-var-accel"}`` of every registered family.
AUTO_TEXT2IMAGE_KEYS: Dict[str, str] = {
    family.pipeline_class_name: f"{name}-var-accel" for name, family in MODEL_FAMILIES.items()
}

_registered: Dict[str, Type] = {}


def _register_auto_pipelines(module) -> None:
    mapping = module.AUTO_TEXT2IMAGE_PIPELINES_MAPPING
    for name, cls in _registered.items():
        key = AUTO_TEXT2IMAGE_KEYS[name]
        if key in mapping and mapping[key] is not cls:
            logger.warning(f"AUTO_TEXT2IMAGE_PIPELINES_MAPPING already has {key!r}; {name} is not added to it")
            continue
        mapping[key] = cls


class _AutoPipelineHook(importlib.abc.MetaPathFinder):
    """Registers our pipelines in diffusers' auto-pipeline mapping right after diffusers imports that module."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _AUTO_PIPELINE_MODULE:
            return None
        sys.meta_path.remove(self)  # the real finders locate the module; this hook is done after one use
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_register(module):
            exec_module(module)
            _register_auto_pipelines(module)

        spec.loader.exec_module = exec_and_register
        return spec


def register_pipelines_with_diffusers(*pipeline_classes: Type) -> None:
    """Let ``DiffusionPipeline`` / ``AutoPipelineForText2Image.from_pretrained`` resolve these classes by name.

    Idempotent. A name that ``diffusers`` itself defines is never overridden (a warning says so).
    """
    import diffusers

    for cls in pipeline_classes:
        name = cls.__name__
        try:
            existing = getattr(diffusers, name)
        except AttributeError:
            existing = None
        if existing is not None and existing is not cls:
            logger.warning(
                f"diffusers already defines {name}; DiffusionPipeline.from_pretrained keeps resolving it to diffusers' class"
            )
            continue
        setattr(diffusers, name, cls)
        # diffusers.pipelines too: diffusers' own tools look pipeline classes up there by name (the source parser
        # of PipelineTesterMixin.test_encode_prompt_works_in_isolation reads ``diffusers.pipelines.<name>``)
        if getattr(diffusers.pipelines, name, None) is None:
            setattr(diffusers.pipelines, name, cls)
        _registered[name] = cls
    if _AUTO_PIPELINE_MODULE in sys.modules:
        _register_auto_pipelines(sys.modules[_AUTO_PIPELINE_MODULE])
    elif not any(isinstance(finder, _AutoPipelineHook) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AutoPipelineHook())
