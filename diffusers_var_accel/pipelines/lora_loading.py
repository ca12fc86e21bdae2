"""``pipe.load_lora_weights(...)`` and the rest of diffusers' pipeline-level LoRA API for the VAR pipelines.

The adapters live on the transformer (:class:`~diffusers_var_accel.models.lora.VARPeftAdapterMixin`); the pipeline
forwards to it as diffusers' transformer-only pipelines do: ``load_lora_weights`` (a peft-format state dict whose keys
start with ``transformer.``, a ``.safetensors`` file or a folder), ``save_lora_weights``, ``fuse_lora`` /
``unfuse_lora``, ``set_adapters``, ``unload_lora_weights``, ``delete_adapters``.
"""

from __future__ import annotations

from diffusers.loaders.lora_pipeline import SanaLoraLoaderMixin


class VARLoraLoaderMixin(SanaLoraLoaderMixin):
    """diffusers' LoRA loader for a pipeline whose only LoRA-loadable component is its ``transformer``.

    diffusers' ``SanaLoraLoaderMixin`` is exactly that (nothing in it is specific to Sana's model: it loads the
    ``transformer.``-prefixed keys into ``pipe.transformer.load_lora_adapter``); it is reused rather than copied."""

    _lora_loadable_modules = ["transformer"]
    transformer_name = "transformer"
