"""What the Infinity and HART pipelines share around the one next-scale loop: token sampling, the per-scale
callback, the pipeline properties diffusers users read, and decoding to the requested output type."""

from __future__ import annotations

import numbers
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import torch
from diffusers.pipelines.pipeline_utils import ImagePipelineOutput

GeneratorArg = Union[None, torch.Generator, Sequence[torch.Generator]]


def mask_top_k_top_p(logits_BNV: torch.Tensor, top_k: Optional[int], top_p: Optional[float]) -> torch.Tensor:
    """A float copy of the logits with everything outside the top-k (ties kept; k is clamped to V) and outside the
    top-p nucleus (the low-probability tail whose mass is <= 1 - top_p) set to -inf. 0 / None disable either."""
    logits = logits_BNV.float().clone()
    V = logits.shape[-1]
    if top_k and top_k > 0:
        kth = logits.topk(min(int(top_k), V), dim=-1, largest=True, sorted=False)[0].amin(dim=-1, keepdim=True)
        logits.masked_fill_(logits < kth, float("-inf"))
    if top_p is not None and top_p > 0:
        sorted_logits, sorted_idx = logits.sort(dim=-1, descending=False)
        remove_sorted = sorted_logits.softmax(dim=-1).cumsum_(dim=-1) <= (1 - top_p)
        remove_sorted[..., -1:] = False
        logits.masked_fill_(remove_sorted.scatter(-1, sorted_idx, remove_sorted), float("-inf"))
    return logits


def sample_categorical(masked_logits_BNV: torch.Tensor, generator: GeneratorArg) -> torch.Tensor:
    """One ``torch.multinomial`` over all ``B * N`` distributions (the official draws), or one per image when a list
    of generators is given (an image then does not depend on its batch). Runs on the generator's device: (B, N)."""
    B, N, V = masked_logits_BNV.shape
    probs = masked_logits_BNV.softmax(dim=-1)
    if isinstance(generator, (list, tuple)):
        return torch.stack([_multinomial(probs[b].view(-1, V), generator[b]).view(N) for b in range(B)])
    return _multinomial(probs.view(-1, V), generator).view(B, N)


def _multinomial(probs_NV: torch.Tensor, generator: Optional[torch.Generator]) -> torch.Tensor:
    device = generator.device if generator is not None else probs_NV.device
    out = torch.multinomial(probs_NV.to(device), num_samples=1, replacement=True, generator=generator)
    return out.to(probs_NV.device)


class LiveGuidance(Sequence):
    """The loop's per-scale guidance, read from the pipeline's ``_guidance_scale`` when the loop reaches each scale.

    ``_guidance_scale`` holds what the call was given: one number (``guidance_scale``) or one value per scale
    (``cfg_list``). A ``callback_on_step_end`` may replace it with either form (diffusers' ``callback_cfg``
    convention: ``pipe._guidance_scale += 1``) and the change applies from the next scale on. ``per_scale(value,
    num_scales)`` turns a number into the family's per-scale values in the loop's convention (1 = no guidance).

    The unconditional rows are set up when the call starts; a callback may not turn guidance on in a call that
    started without it (there are no unconditional rows to guide with).
    """

    def __init__(self, pipeline, num_scales: int, per_scale: Callable[[float, int], List[float]],
                 list_to_loop: Callable[[float], float] = float):
        self._pipeline, self._num_scales = pipeline, num_scales
        self._per_scale, self._list_to_loop = per_scale, list_to_loop
        self._with_cfg = any(self._resolve(si) != 1 for si in range(num_scales))

    def _resolve(self, si: int) -> float:
        value = self._pipeline._guidance_scale
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            return float(self._per_scale(float(value), self._num_scales)[si])
        if isinstance(value, (list, tuple)) and len(value) == self._num_scales and all(
                isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value):
            return float(self._list_to_loop(float(value[si])))
        raise ValueError(f"_guidance_scale must be a number or a list of {self._num_scales} numbers (one per scale); "
                         f"got {value!r}")

    def __len__(self) -> int:
        return self._num_scales

    def __getitem__(self, si):
        if isinstance(si, slice):
            return [self[i] for i in range(*si.indices(self._num_scales))]
        value = self._resolve(si)
        if value != 1 and not self._with_cfg:
            raise ValueError(f"guidance at scale {si} was changed to {self._pipeline._guidance_scale!r}, but this call "
                             "started without guidance, so no unconditional rows ran; start the call with guidance on")
        return value


class NextScalePipelineMixin:
    """Properties and steps common to the next-scale pipelines (mixed into ``DiffusionPipeline`` subclasses)."""

    _interrupt = False

    @property
    def guidance_scale(self):
        """The guidance of the current (or last) call: the ``guidance_scale`` number, or the per-scale list when
        ``cfg_list`` was given (or a callback set one)."""
        return self._guidance_scale

    @property
    def num_timesteps(self):
        """The number of scales of the current (or last) call."""
        return self._num_timesteps

    @property
    def interrupt(self):
        return self._interrupt

    def _scale_callback(self, callback: Optional[Callable], tensor_inputs: Sequence[str], scale_schedule, prompt_embeds, progress):
        """The loop's ``on_scale_end``: the user's ``callback_on_step_end`` (which may replace ``latents``) and the
        progress bar. A diffusers ``PipelineCallback`` / ``MultiPipelineCallbacks`` brings its own ``tensor_inputs``
        (as diffusers' pipelines take them), checked against ``_callback_tensor_inputs`` here."""
        from diffusers.callbacks import MultiPipelineCallbacks, PipelineCallback

        if isinstance(callback, (PipelineCallback, MultiPipelineCallbacks)):
            tensor_inputs = list(callback.tensor_inputs)
            bad = [k for k in tensor_inputs if k not in self._callback_tensor_inputs]
            if bad:
                raise ValueError(f"{type(callback).__name__}.tensor_inputs {bad} are not in {self._callback_tensor_inputs}")

        def on_scale_end(si: int, state) -> None:
            if callback is not None:
                values: Dict[str, Any] = {"latents": state.f_hat, "tokens": state.tokens.get(si), "logits": state.logits.get(si),
                                          "prompt_embeds": prompt_embeds}
                out = callback(self, si, tuple(scale_schedule[si]), {k: values[k] for k in tensor_inputs}) or {}
                if "latents" in out:
                    state.f_hat = out["latents"]
            progress.update()

        return on_scale_end

    def _decode_output(self, latents: torch.Tensor, output_type: str, return_dict: bool):
        """The images in ``output_type`` (``"latent"`` returns the summed latent as is)."""
        if output_type == "latent":
            image = latents
        else:
            image = self.vae.decode(latents.to(self.vae.dtype))
            image = self.image_processor.postprocess(image, output_type=output_type)
        self.maybe_free_model_hooks()
        if not return_dict:
            return (image,)
        return ImagePipelineOutput(images=image)
