"""The embedded default model: a tiny Infinity trained on the captioned-shapes world, shipped inside the package.

``scripts/train_embedded.py`` trains it from scratch on a CPU (settings and losses in its docstring and
``docs/embedded.md``). It loads offline::

    from diffusers_var_accel import InfinityPipeline
    pipe = InfinityPipeline.from_pretrained("embedded")   # or diffusers_var_accel.pipelines.pipeline_loading.load_embedded_pipeline()
    image = pipe("a blue square to the left of a yellow triangle", **EMBEDDED_SAMPLING).images[0]

It makes 64x64 images of 1-3 circles / squares / triangles; prompts outside the shapes world's vocabulary map to
``<unk>``.

This module holds only the packaged folder's path and names (it imports nothing of the package, so the pipelines can
resolve the name ``"embedded"`` without an import circle); :func:`diffusers_var_accel.pipelines.pipeline_loading.load_embedded_pipeline`
loads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

#: Folder of the packaged pipeline (``model_index.json``, transformer, vae, text_encoder, tokenizer).
EMBEDDED_MODEL_PATH = Path(__file__).resolve().parent / "shapes-infinity-tiny"

#: Names that ``InfinityPipeline.from_pretrained`` resolves to the packaged folder.
EMBEDDED_MODEL_NAMES = ("embedded", "shapes-infinity-tiny")

#: The key of the embedded model's own packaged presets (``presets/embedded/<method>``, made by ``var-accel calibrate``,
#: docs/calibration.md): ``pipe.enable_<method>()`` on a pipeline loaded from :data:`EMBEDDED_MODEL_PATH` uses them.
EMBEDDED_PRESET_MODEL = "embedded"

#: Sampling settings the embedded model is evaluated with (docs/embedded.md).
EMBEDDED_SAMPLING: Dict[str, Any] = dict(guidance_scale=2.0, tau=1.0, top_k=0, top_p=None)


def embedded_model_path() -> Path:
    """The packaged folder; raises a clear error when the package was installed without it."""
    if not (EMBEDDED_MODEL_PATH / "model_index.json").is_file():
        raise FileNotFoundError(
            f"the embedded model is missing from this installation ({EMBEDDED_MODEL_PATH}); "
            "reinstall the package or train it with scripts/train_embedded.py"
        )
    return EMBEDDED_MODEL_PATH
