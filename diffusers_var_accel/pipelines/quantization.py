"""torchao weight quantisation of the next-scale pipelines, the diffusers way: what is supported, refused before
loading or saving with an error naming the supported forms.

Supported (tested with every acceleration method on both families, ``tests/library/test_quantization.py``):

* ``Pipeline.from_pretrained(folder, quantization_config=PipelineQuantizationConfig(quant_mapping={...}))`` with
  ``"transformer": diffusers.TorchAoConfig(form)`` and ``"text_encoder": transformers.TorchAoConfig(form)``, where
  ``form`` is torchao's ``Int8WeightOnlyConfig()`` or ``Float8WeightOnlyConfig()``; such a pipeline saves with
  ``save_pretrained`` and loads again (the folder records the quantisation) to the same images;
* ``torchao.quantization.quantize_(pipe.transformer, form)`` (and ``pipe.text_encoder``) on a loaded pipeline.

Refused here, because diffusers or torchao would fail later with a message that names neither the pipeline nor the
way out: the ``quant_backend=`` form (diffusers 0.42.1 checks its keyword arguments against transformers' config class,
whose signature differs in transformers 5.x), a config class of the other library for a component, a component other
than the transformer and the text encoder (the tokenizers hold their weights in convolutions and codebooks, which
torchao's weight-only forms leave as they are, so the mapping would do nothing), other torchao forms (int4
weight-only needs CUDA kernels or the ``mslk`` package; activation quantisation is untested here), and
``save_pretrained`` of weights quantised by ``quantize_`` (nothing in the folder would say how to read them).
"""

from __future__ import annotations

from typing import Any, Dict, Iterable

#: torchao weight forms the pipelines are tested with (class names of ``torchao.quantization`` configs).
SUPPORTED_TORCHAO_FORMS = ("Int8WeightOnlyConfig", "Float8WeightOnlyConfig")

#: Components a ``quant_mapping`` may name, and the config class (module, name) each takes: diffusers' for our
#: transformers, transformers' for the text encoders (T5, Qwen2).
QUANTIZABLE_COMPONENTS: Dict[str, str] = {
    "transformer": "diffusers.TorchAoConfig",
    "text_encoder": "transformers.TorchAoConfig",
}

SUPPORTED_FORMS = (
    "quantization_config=PipelineQuantizationConfig(quant_mapping={'transformer': diffusers.TorchAoConfig(form), "
    "'text_encoder': transformers.TorchAoConfig(form)}) (either entry alone), or "
    "torchao.quantization.quantize_(pipe.transformer, form) after loading, with form = "
    "torchao.quantization.Int8WeightOnlyConfig() or Float8WeightOnlyConfig()"
)


def _config_library(config: Any) -> str:
    """``"diffusers"`` or ``"transformers"``: the library whose quantisation config class ``config`` is."""
    return type(config).__module__.split(".")[0]


def check_quantization_config(pipeline_name: str, quantization_config: Any) -> None:
    """Check a pipeline ``from_pretrained``'s ``quantization_config`` before anything is loaded.

    Raises:
        TypeError: it is not a ``PipelineQuantizationConfig``, or a component's config is the other library's class.
        ValueError: the ``quant_backend=`` form, a component that is not quantised, or a torchao form other than
            int8 / float8 weight-only; each message names the value and the supported forms.
    """
    if quantization_config is None:
        return
    from diffusers import PipelineQuantizationConfig

    if not isinstance(quantization_config, PipelineQuantizationConfig):
        raise TypeError(
            f"{pipeline_name}.from_pretrained: quantization_config must be a diffusers PipelineQuantizationConfig, "
            f"got {type(quantization_config).__name__}; supported: {SUPPORTED_FORMS}"
        )
    mapping = quantization_config.quant_mapping
    if not mapping:
        raise ValueError(
            f"{pipeline_name}.from_pretrained: the quant_backend= form of PipelineQuantizationConfig "
            f"(quant_backend={quantization_config.quant_backend!r}) is not supported (diffusers 0.42 cannot build "
            f"transformers' config from it with transformers 5.x); supported: {SUPPORTED_FORMS}"
        )
    for component, config in mapping.items():
        if component not in QUANTIZABLE_COMPONENTS:
            raise ValueError(
                f"{pipeline_name}.from_pretrained: quant_mapping names {component!r}, which is not quantised (its "
                f"weights are convolutions and codebooks that torchao's weight-only forms leave as they are); "
                f"allowed components: {list(QUANTIZABLE_COMPONENTS)}; supported: {SUPPORTED_FORMS}"
            )
        expected = QUANTIZABLE_COMPONENTS[component]
        library = expected.split(".")[0]
        if type(config).__name__ != "TorchAoConfig" or _config_library(config) != library:
            raise TypeError(
                f"{pipeline_name}.from_pretrained: quant_mapping[{component!r}] is a "
                f"{_config_library(config)}.{type(config).__name__}; the {component} takes {expected} "
                f"({library} loads it); supported: {SUPPORTED_FORMS}"
            )
        form = type(config.quant_type).__name__
        if form not in SUPPORTED_TORCHAO_FORMS:
            raise ValueError(
                f"{pipeline_name}.from_pretrained: quant_mapping[{component!r}] uses the torchao form {form}, which "
                f"these pipelines do not support (int4 weight-only needs CUDA kernels or the mslk package; "
                f"activation quantisation is untested); supported forms: {list(SUPPORTED_TORCHAO_FORMS)}; "
                f"{SUPPORTED_FORMS}"
            )


def _holds_torchao_weights(module: Any) -> bool:
    return any(type(p).__module__.startswith("torchao") for p in module.parameters())


def check_quantized_components_saveable(pipeline_name: str, components: Iterable) -> None:
    """Before ``save_pretrained`` writes anything: a component whose weights were quantised by ``torchao.quantize_``
    (torchao tensors, but no quantiser recorded by ``from_pretrained``) is refused; safetensors cannot write those
    tensors and the folder would not say how to read them.

    Raises:
        ValueError: naming the component and the supported form.
    """
    import torch

    for name, component in components:
        if not isinstance(component, torch.nn.Module) or getattr(component, "hf_quantizer", None) is not None:
            continue
        if _holds_torchao_weights(component):
            raise ValueError(
                f"{pipeline_name}.save_pretrained: {name} holds weights quantised by torchao.quantization.quantize_, "
                f"which a saved folder cannot describe; to save a quantised pipeline load it with "
                f"quantization_config=PipelineQuantizationConfig(quant_mapping={{'{name}': "
                f"{QUANTIZABLE_COMPONENTS.get(name, 'diffusers.TorchAoConfig')}(form)}}) and save that "
                f"(supported: {SUPPORTED_FORMS})"
            )


_SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}


def _stored_torchao_dtype(component_folder: str) -> Any:
    """The dtype of the unquantised floating-point weights of a torchao-quantised component folder saved by
    ``save_pretrained`` (its ``config.json`` records the quantisation), or ``None`` for any other folder."""
    import glob
    import json
    import os

    import torch
    from safetensors import safe_open

    try:
        with open(os.path.join(component_folder, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    quantization = config.get("quantization_config") if isinstance(config, dict) else None
    if not isinstance(quantization, dict) or quantization.get("quant_method") != "torchao":
        return None
    for path in sorted(glob.glob(os.path.join(component_folder, "*.safetensors"))):
        with safe_open(path, framework="pt") as f:
            metadata = f.metadata() or {}
            for key in f.keys():
                if metadata.get(key, '{"_type": "Tensor"}').startswith('{"_type": "Tensor"'):
                    name = _SAFETENSORS_DTYPES.get(f.get_slice(key).get_dtype())
                    if name is not None:
                        return getattr(torch, name)
    return None


def settle_quantized_folder_dtype(pipeline_name: str, folder: str, components: Iterable[str], kwargs: Dict) -> None:
    """Loading a folder that holds torchao-quantised components (saved from a quantised pipeline): each is loaded in
    the dtype it was saved in. Without ``dtype`` diffusers' torchao quantiser would cast its other weights to bfloat16
    while the quantised weights keep theirs (a dtype mismatch inside generation), so ``kwargs["dtype"]`` is set to the
    stored dtypes; a ``dtype`` that differs from a stored one is refused.

    Raises:
        ValueError: ``dtype`` differs from the dtype a quantised component was saved in (both named).
    """
    import os

    stored = {}
    for name in components:
        dtype = _stored_torchao_dtype(os.path.join(folder, name))
        if dtype is not None:
            stored[name] = dtype
    if not stored:
        return
    requested = kwargs.get("dtype")
    if requested is None:
        kwargs["dtype"] = {"default": None, **stored}
        return
    for name, dtype in stored.items():
        wanted = requested.get(name, requested.get("default")) if isinstance(requested, dict) else requested
        if wanted is not None and wanted != dtype:
            raise ValueError(
                f"{pipeline_name}.from_pretrained: {os.path.join(folder, name)} holds torchao-quantised weights saved "
                f"with {dtype}; dtype={wanted} would leave them in {dtype} beside {wanted} weights; load it with "
                f"dtype={dtype} (or without dtype)"
            )
