"""Loading a pipeline by the name the command line and the benchmark take (``--model``).

Below both :mod:`diffusers_var_accel.lab.cli` and :mod:`diffusers_var_accel.lab.bench`, above the pipelines and the Hub helpers,
so neither front end imports the other. The families' own names (their tiny models, their convert sub-commands) come
from :mod:`diffusers_var_accel.families`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

from diffusers_var_accel.pipelines.pipeline_loading import load_embedded_pipeline
from diffusers_var_accel.families import MODEL_FAMILIES
from diffusers_var_accel.lab.families import family_of_tiny_model, tiny_model_names

_TORCH_DTYPES = ("float32", "bfloat16", "float16")


def model_names_hint() -> str:
    """The ``--model`` names that need no folder, for messages: ``'embedded', 'tiny' or 'tiny-hart'``."""
    names = [f"'{name}'" for name in ("embedded", *tiny_model_names())]
    return ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else names[0]


def load_pipeline(model: Optional[str], device: str, dtype: str):
    """The pipeline ``--model`` names, on ``device`` in ``dtype`` (``"float32"``, ``"bfloat16"``, ``"float16"``).

    ``model``: ``None`` / an embedded model name (the packaged model), a family's tiny model (``"tiny"`` /
    ``"tiny-hart"``: random weights, built locally), or a converted pipeline folder (its ``model_index.json``, plain or
    Hub-shim form, names the class).

    Raises:
        ValueError: a folder without ``model_index.json``, or a Hub-shim folder whose ``pipeline.py`` is not ours.
    """
    import torch

    torch_dtype = {name: getattr(torch, name) for name in _TORCH_DTYPES}[dtype]
    from diffusers_var_accel.embedded import EMBEDDED_MODEL_NAMES

    tiny_family = family_of_tiny_model(model)
    if model is None or model in EMBEDDED_MODEL_NAMES:
        return load_embedded_pipeline(dtype=torch_dtype).to(device)
    if tiny_family is not None:
        print(
            f"Using a tiny {tiny_family.title} pipeline with RANDOM weights (built locally, no download). Its images "
            "are noise-like; pass --model <converted folder> for a real checkpoint.",
            file=sys.stderr,
        )
        pipe = tiny_family.build_tiny_pipeline(seed=0)
        for component in pipe.components.values():  # --dtype holds for the tiny models too (built in float32)
            if isinstance(component, torch.nn.Module):
                # plain Module.to: diffusers' ModelMixin.to warns about float32-kept modules even when there are none
                torch.nn.Module.to(component, dtype=torch_dtype)
    else:
        from diffusers_var_accel.hub import has_hub_shim, pipeline_class

        index = Path(model) / "model_index.json"
        if not index.is_file():
            converts = " or ".join(f"'var-accel convert {name} ...'" for name in MODEL_FAMILIES)
            raise ValueError(
                f"--model {model}: no model_index.json there; convert official checkpoints first with "
                f"{converts} (see var-accel convert --help), or pass {model_names_hint()}"
            )
        cls = pipeline_class(model)  # plain or Hub-shim form (["pipeline", "<class>"]) of model_index.json
        # A folder with the Hub shim (hub.write_hub_shim) makes diffusers execute its pipeline.py, which is the
        # one-line import of our own class: loading it needs trust_remote_code=True. Only our exact shim is trusted.
        shim_form = isinstance(json.loads(index.read_text()).get("_class_name"), list)
        if shim_form and not has_hub_shim(model):
            raise ValueError(
                f"--model {model}: model_index.json is in Hub-shim form but pipeline.py is not the "
                "diffusers_var_accel shim; restore it with diffusers_var_accel.hub.write_hub_shim(folder, "
                "overwrite=True) or undo it with diffusers_var_accel.hub.remove_hub_shim(folder)"
            )
        options = {"trust_remote_code": True} if shim_form else {}
        pipe = cls.from_pretrained(model, dtype=torch_dtype, **options)
    return pipe.to(device)
