"""Loading a pipeline by the name the command line and the benchmark take (``--model``).

Below both :mod:`diffusers_var_accel.cli` and :mod:`diffusers_var_accel.bench`, above the pipelines and the Hub helpers,
so neither front end imports the other.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional


def load_pipeline(model: Optional[str], device: str, dtype: str):
    """The pipeline ``--model`` names, on ``device`` in ``dtype`` (``"float32"``, ``"bfloat16"``, ``"float16"``).

    ``model``: ``None`` / an embedded model name (the packaged model), ``"tiny"`` / ``"tiny-hart"`` (random weights,
    built locally), or a converted pipeline folder (its ``model_index.json``, plain or Hub-shim form, names the class).

    Raises:
        ValueError: a folder without ``model_index.json``, or a Hub-shim folder whose ``pipeline.py`` is not ours.
    """
    import torch

    from .pipelines.infinity import InfinityPipeline

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    from .embedded import EMBEDDED_MODEL_NAMES, embedded_model_path

    if model is None or model in EMBEDDED_MODEL_NAMES:
        return InfinityPipeline.from_pretrained(embedded_model_path(), dtype=torch_dtype).to(device)
    if model in ("tiny", "tiny-hart"):
        from .utils.tiny import build_tiny_hart_pipeline, build_tiny_infinity_pipeline

        name = "HART" if model == "tiny-hart" else "Infinity"
        print(f"Using a tiny {name} pipeline with RANDOM weights (built locally, no download). Its images are noise-like; "
              "pass --model <converted folder> for a real checkpoint.", file=sys.stderr)
        pipe = build_tiny_hart_pipeline(seed=0) if model == "tiny-hart" else build_tiny_infinity_pipeline(seed=0)
        for component in pipe.components.values():  # --dtype holds for the tiny models too (built in float32)
            if isinstance(component, torch.nn.Module):
                # plain Module.to: diffusers' ModelMixin.to warns about float32-kept modules even when there are none
                torch.nn.Module.to(component, dtype=torch_dtype)
    else:
        from .hub import has_hub_shim, pipeline_class

        index = Path(model) / "model_index.json"
        if not index.is_file():
            raise ValueError(f"--model {model}: no model_index.json there; convert official checkpoints first with "
                             "'var-accel convert infinity ...' or 'var-accel convert hart ...' (see var-accel convert --help), "
                             "or pass 'embedded', 'tiny' or 'tiny-hart'")
        cls = pipeline_class(model)  # plain or Hub-shim form (["pipeline", "<class>"]) of model_index.json
        # A folder with the Hub shim (hub.write_hub_shim) makes diffusers execute its pipeline.py, which is the
        # one-line import of our own class: loading it needs trust_remote_code=True. Only our exact shim is trusted.
        shim_form = isinstance(json.loads(index.read_text()).get("_class_name"), list)
        if shim_form and not has_hub_shim(model):
            raise ValueError(f"--model {model}: model_index.json is in Hub-shim form but pipeline.py is not the "
                             "diffusers_var_accel shim; restore it with diffusers_var_accel.hub.write_hub_shim(folder, "
                             "overwrite=True) or undo it with diffusers_var_accel.hub.remove_hub_shim(folder)")
        options = {"trust_remote_code": True} if shim_form else {}
        pipe = cls.from_pretrained(model, dtype=torch_dtype, **options)
    return pipe.to(device)
