"""diffusers' group offloading (``enable_group_offload``) on these models and pipelines: refused, saying why.

Group offloading moves a group of modules to the device when the group's ``forward`` is called. These models call
part of their weights outside any ``forward`` (the transformers' start embedding, scale embeddings, text projection
and heads, read by the next-scale loop; the tokenizers' decoder, called through ``decode``), so those weights stay
on the offload device and a generation reads them there (NaN with disk offload). Until every such module is reached
through a ``forward`` (or declared to diffusers), ``enable_group_offload`` raises at once instead of installing hooks
that produce wrong images. ``enable_model_cpu_offload()`` works with every acceleration method (docs/memory.md).
"""

from __future__ import annotations

GROUP_OFFLOAD_REFUSAL = (
    "{owner}.enable_group_offload is not supported yet: {owner} calls some of its weights outside a module forward "
    "(embeddings, heads, the tokenizer's decoder), which group offloading never moves to the device, so images "
    "would be wrong; use enable_model_cpu_offload() (with any acceleration method) and see docs/memory.md"
)


def refuse_group_offload(owner: object) -> None:
    """Raise the refusal for ``owner`` (a model or a pipeline).

    Raises:
        NotImplementedError: always, naming ``owner``'s class and the offload that works.
    """
    raise NotImplementedError(GROUP_OFFLOAD_REFUSAL.format(owner=type(owner).__name__))


class GroupOffloadRefusalMixin:
    """Mixed in before ``ModelMixin``: ``enable_group_offload`` refused (see the module docstring)."""

    def enable_group_offload(self, *args, **kwargs) -> None:
        """Refused: see :mod:`diffusers_var_accel.models.group_offload`.

        Raises:
            NotImplementedError: always.
        """
        refuse_group_offload(self)
