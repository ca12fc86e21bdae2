"""The per-scale guidance a call passes to the loop, read live from the pipeline (diffusers' ``callback_cfg``
convention: a callback may change it between scales)."""

from __future__ import annotations

import numbers
from typing import Callable, List, Sequence


class LiveGuidance(Sequence):
    """The loop's per-scale guidance, read from the pipeline's ``_guidance_scale`` when the loop reaches each scale.

    ``_guidance_scale`` holds what the call was given: one number (``guidance_scale``) or one value per scale
    (``cfg_list``). A ``callback_on_step_end`` may replace it with either form (diffusers' ``callback_cfg``
    convention: ``pipe._guidance_scale += 1``) and the change applies from the next scale on. ``per_scale(value,
    num_scales)`` turns a number into the family's per-scale values; values stay in the family's own convention
    (``no_guidance``, the registry's value for the family, means none), which is the loop's.

    The unconditional rows are set up when the call starts; a callback may not turn guidance on in a call that
    started without it (there are no unconditional rows to guide with).
    """

    def __init__(self, pipeline, num_scales: int, per_scale: Callable[[float, int], List[float]], no_guidance: float):
        self._pipeline, self._num_scales = pipeline, num_scales
        self._per_scale, self._no_guidance = per_scale, float(no_guidance)
        self._with_cfg = any(self._resolve(si) != self._no_guidance for si in range(num_scales))

    def _resolve(self, si: int) -> float:
        value = self._pipeline._guidance_scale
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            return float(self._per_scale(float(value), self._num_scales)[si])
        if (
            isinstance(value, (list, tuple))
            and len(value) == self._num_scales
            and all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value)
        ):
            return float(value[si])
        raise ValueError(
            f"_guidance_scale must be a number or a list of {self._num_scales} numbers (one per scale); got {value!r}"
        )

    def __len__(self) -> int:
        return self._num_scales

    def __getitem__(self, si):
        if isinstance(si, slice):
            return [self[i] for i in range(*si.indices(self._num_scales))]
        value = self._resolve(si)
        if value != self._no_guidance and not self._with_cfg:
            raise ValueError(
                f"guidance at scale {si} was changed to {self._pipeline._guidance_scale!r}, but this call "
                "started without guidance, so no unconditional rows ran; start the call with guidance on"
            )
        return value
