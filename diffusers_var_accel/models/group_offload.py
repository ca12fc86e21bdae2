"""diffusers' group offloading (``enable_group_offload``, ``apply_group_offloading``) on these models: the weights the
next-scale loop reads outside a module ``forward`` stay on the device for the call.

Group offloading moves a group of tensors to the device when the ``forward`` of the group's first module is called and
back after the last one's. The repeated blocks of the transformers are reached that way (the loop calls each block),
but the rest of each model is read between forwards: the transformers' start embedding, scale embeddings, text
projection, head and (HART) diffusion head are called by the loop's family methods, the tokenizers' codebooks and
decoder through ``add_scale_codes`` / ``decode``, and the decoder's up-blocks through their children, not their own
``forward``. diffusers would leave those tensors offloaded (NaN with disk offload).

So each model declares which of its modules are *streamed* (``_group_offload_streamed_modules``: the transformers'
``blocks``; none for the tokenizers), and the pipelines' ``__call__`` keeps every other offload group of the model
*resident*: onloaded once when the call starts, its hooks' onload/offload made no-ops for the call, offloaded when the
call ends. The streamed blocks move group by group as diffusers does it (block level: ``num_blocks_per_group`` blocks;
leaf level: one layer). A tensor of a streamed module that the block reads outside its own module's ``forward``
(Infinity's cross-attention norm, whose fp32 copy the block takes) is declared in
``_group_offload_resident_in_streamed`` and kept resident at leaf level (at block level it moves with its block).

Without group offload hooks on a model nothing is pinned and nothing is done per pass: the check runs once per call.
Text encoders (transformers models) need nothing: they are called through their ``forward``.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator, List, Optional, Sequence

import torch

#: diffusers' registry name of the group-offloading hook (``diffusers.hooks.group_offloading._GROUP_OFFLOADING``).
GROUP_OFFLOADING_HOOK = "group_offloading"


def _nothing() -> None:
    """The no-op a resident group's onload and offload become for the call."""


def offload_groups(model: torch.nn.Module) -> List[Any]:
    """The distinct diffusers ``ModuleGroup``\\ s of the group-offload hooks on ``model`` and its submodules, in module
    order (empty when group offloading is not applied)."""
    groups: dict = {}
    for module in model.modules():
        registry = getattr(module, "_diffusers_hook", None)
        hook = registry.get_hook(GROUP_OFFLOADING_HOOK) if registry is not None else None
        if hook is not None:
            groups.setdefault(id(hook.group), hook.group)
    return list(groups.values())


def group_tensors(group: Any) -> List[torch.Tensor]:
    """Every parameter and buffer a group onloads and offloads."""
    tensors = [t for m in group.modules for t in (*m.parameters(), *m.buffers())]
    return list(dict.fromkeys([*tensors, *group.parameters, *group.buffers]))


def is_resident(name: str, streamed: Sequence[str], resident_in_streamed: Sequence[str]) -> bool:
    """Whether the tensor called ``name`` stays on the device for the call: it is outside every streamed module, or a
    module of a streamed block that the block reads outside that module's ``forward``."""
    if not any(name.startswith(prefix + ".") for prefix in streamed):
        return True
    return any(f".{child}." in f".{name}" for child in resident_in_streamed)


def resident_groups(model: torch.nn.Module) -> List[Any]:
    """The offload groups of ``model`` that stay on the device for a call: those whose tensors are all resident
    (:func:`is_resident`, by the model's declarations). Empty without group offloading or declarations."""
    streamed = getattr(model, "_group_offload_streamed_modules", None)
    if streamed is None:
        return []
    groups = offload_groups(model)
    if not groups:
        return []
    kept = getattr(model, "_group_offload_resident_in_streamed", ())
    names = {t: n for n, t in (*model.named_parameters(remove_duplicate=False), *model.named_buffers())}
    return [
        g for g in groups if all(is_resident(names.get(t, ""), streamed, kept) for t in group_tensors(g) if t in names)
    ]


@contextlib.contextmanager
def resident_for_call(models: Sequence[Optional[torch.nn.Module]]) -> Iterator[List[Any]]:
    """Onload the resident groups of ``models`` (:func:`resident_groups`) for the span and keep them there (their hooks'
    onload and offload are no-ops meanwhile); offload them when the span ends, whatever happens in it."""
    groups = [g for model in models if model is not None for g in resident_groups(model)]
    pinned = []
    try:
        for group in groups:
            group.onload_()
            if group.stream is not None:  # the copy ran on the side stream: finish it before the weights are read
                group.stream.synchronize()
            group.onload_ = group.offload_ = _nothing
            pinned.append(group)
        yield groups
    finally:
        for group in pinned:
            del group.onload_, group.offload_  # the class's methods again
            group.offload_()


def keeps_group_offload_residents(call: Callable) -> Callable:
    """Decorate a pipeline's ``__call__``: its models' resident groups (:func:`resident_for_call`) stay on the device
    for the call. Whether diffusers' group offloading is applied (by ``pipe.enable_group_offload``, a model's
    ``enable_group_offload`` or ``apply_group_offloading``) is looked up once per call."""

    @functools.wraps(call)
    def call_with_residents(self, *args, **kwargs):
        models = [getattr(self, name, None) for name in ("transformer", "vae")]
        with resident_for_call(models):
            return call(self, *args, **kwargs)

    return call_with_residents


def tied_leaf_modules(module: torch.nn.Module) -> List[str]:
    """Names of the leaf layers of ``module`` whose parameter another leaf layer also holds (T5's ``shared`` and
    ``encoder.embed_tokens``): diffusers' leaf-level disk offload writes one file per leaf and saves the second one
    after the first has replaced the shared tensor by an empty placeholder, so that layer would load garbage."""
    from diffusers.hooks.group_offloading import _GO_LC_SUPPORTED_PYTORCH_LAYERS

    owners: dict = {}
    for name, leaf in module.named_modules():
        if isinstance(leaf, _GO_LC_SUPPORTED_PYTORCH_LAYERS):
            for parameter in leaf.parameters(recurse=False):
                owners.setdefault(parameter, []).append(name)
    return sorted({n for names in owners.values() if len(names) > 1 for n in names})


def refuse_tied_leaf_disk_offload(pipe: Any, *args: Any, **kwargs: Any) -> None:
    """Raise before anything is hooked if ``pipe.enable_group_offload(*args, **kwargs)`` would offload a component
    with tied leaf layers (:func:`tied_leaf_modules`) to disk at leaf level.

    Raises:
        ValueError: naming the component, its tied layers and the settings that work.
    """
    import inspect

    from diffusers import DiffusionPipeline

    bound = inspect.signature(DiffusionPipeline.enable_group_offload).bind(pipe, *args, **kwargs)
    bound.apply_defaults()
    settings = bound.arguments
    if str(settings["offload_type"]) not in ("leaf_level", "GroupOffloadingType.LEAF_LEVEL"):
        return
    if settings["offload_to_disk_path"] is None:
        return
    excluded = settings["exclude_modules"] or []
    excluded = [excluded] if isinstance(excluded, str) else excluded
    for name, component in pipe.components.items():
        if name in excluded or not isinstance(component, torch.nn.Module):
            continue
        tied = tied_leaf_modules(component)
        if tied:
            raise ValueError(
                f"enable_group_offload(offload_type='leaf_level', offload_to_disk_path=...) would load wrong weights "
                f"into {name}: its layers {tied} share one parameter, which diffusers' leaf-level disk offload saves "
                f"once per layer, the second time after replacing it by an empty placeholder; use "
                f"offload_type='block_level', offload to memory (no offload_to_disk_path), or "
                f"exclude_modules=[{name!r}]"
            )
