"""LoRA on the VAR transformers: diffusers' PEFT adapter support, with a refusal where an adapter could not act.

Both transformers take diffusers' :class:`~diffusers.loaders.peft.PeftAdapterMixin` (``load_lora_adapter``,
``add_adapter``, ``set_adapters``, ``fuse_lora`` / ``unfuse_lora``, ``unload_lora``, ``delete_adapters``). A peft
LoRA layer acts only where its module is *called*; every projection of the blocks is (the fused q/k/v and k/v
projections are :class:`~diffusers_var_accel.models.attention_processor.FusedProjection` modules that take the
call's bias, so a LoRA layer wrapping them keeps the one-GEMM path and adds its update). A module whose weight the
model reads without calling it would make an adapter a silent no-op: the transformer lists those in
``_lora_refused_modules`` (a name pattern and why), and loading an adapter on one of them raises, naming the module.

``fuse_lora`` merges the adapters into the weights (peft's merge, the same values as adding each delta by hand);
``unfuse_lora`` restores the weights bit for bit from a copy kept on the CPU while fused (peft's own unmerge subtracts
the delta again, which is within float rounding of the original weight, not equal to it).
"""

from __future__ import annotations

import re
from typing import Dict, List

from diffusers.loaders.peft import PeftAdapterMixin


def _adapted_module_names(model, adapter_name: str) -> List[str]:
    """The names of the modules of ``model`` that carry adapter ``adapter_name`` (peft's tuner layers)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    names = []
    for name, module in model.named_modules():
        if isinstance(module, BaseTunerLayer) and adapter_name in _layer_adapter_names(module):
            names.append(name)
    return names


def _layer_adapter_names(layer) -> set:
    names = set()
    for attribute in layer.adapter_layer_names:
        names.update(getattr(layer, attribute, {}).keys())
    return names


class VARPeftAdapterMixin(PeftAdapterMixin):
    """diffusers' PEFT adapter support, refusing adapters on the modules an adapter cannot act on.

    ``_lora_refused_modules`` maps a regular expression (matched in full against the module's name in the
    transformer) to the reason the model reads that module's weight without calling it."""

    _lora_refused_modules: Dict[str, str] = {}

    def load_lora_adapter(self, pretrained_model_name_or_path_or_dict, prefix="transformer", hotswap=False, **kwargs):
        """diffusers' ``load_lora_adapter`` (a peft-format state dict, a file or a folder); an adapter on a module in
        ``_lora_refused_modules`` is removed again and refused with a ``ValueError`` naming the module."""
        before = set(getattr(self, "peft_config", {}))
        super().load_lora_adapter(pretrained_model_name_or_path_or_dict, prefix=prefix, hotswap=hotswap, **kwargs)
        for adapter_name in set(getattr(self, "peft_config", {})) - before:
            self._refuse_unusable_targets(adapter_name)

    def add_adapter(self, adapter_config, adapter_name: str = "default") -> None:
        """diffusers' ``add_adapter`` (a peft config, e.g. to train a LoRA); a target in ``_lora_refused_modules`` is
        refused with a ``ValueError`` naming the module."""
        super().add_adapter(adapter_config, adapter_name=adapter_name)
        self._refuse_unusable_targets(adapter_name)

    def fuse_lora(self, lora_scale: float = 1.0, safe_fusing: bool = False, adapter_names=None) -> None:
        """diffusers' ``fuse_lora``; the weights it changes are first copied to the CPU, for :meth:`unfuse_lora`."""
        from peft.tuners.tuners_utils import BaseTunerLayer

        kept = self.__dict__.setdefault("_weights_before_fusing", {})
        for name, module in self.named_modules():
            if isinstance(module, BaseTunerLayer) and name not in kept:
                kept[name] = module.get_base_layer().weight.detach().to("cpu", copy=True)
        super().fuse_lora(lora_scale=lora_scale, safe_fusing=safe_fusing, adapter_names=adapter_names)

    def unfuse_lora(self) -> None:
        """diffusers' ``unfuse_lora``, then the fused weights restored bit for bit from the copies :meth:`fuse_lora`
        kept."""
        super().unfuse_lora()
        kept = self.__dict__.pop("_weights_before_fusing", {})
        modules = dict(self.named_modules())
        for name, weight in kept.items():
            module = modules.get(name)
            if module is not None:
                base = module.get_base_layer() if hasattr(module, "get_base_layer") else module
                base.weight.data.copy_(weight)

    def unload_lora(self) -> None:
        """diffusers' ``unload_lora``: fused adapters stay in the weights (nothing is left to unfuse)."""
        super().unload_lora()
        self.__dict__.pop("_weights_before_fusing", None)

    def _refuse_unusable_targets(self, adapter_name: str) -> None:
        for name in _adapted_module_names(self, adapter_name):
            for pattern, reason in self._lora_refused_modules.items():
                if re.fullmatch(pattern, name):
                    self.delete_adapters(adapter_name)
                    if not getattr(self, "peft_config", None):  # no adapter left: the plain modules back
                        self.unload_lora()
                    raise ValueError(
                        f"adapter {adapter_name!r} targets {type(self).__name__}.{name}, which cannot take a LoRA: "
                        f"{reason}; target the other modules (the adapter was not loaded)"
                    )
