"""Text-to-image generation with Infinity (bitwise next-scale prediction), through the shared next-scale loop."""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from diffusers.image_processor import VaeImageProcessor
from diffusers.pipelines.pipeline_utils import DiffusionPipeline
from diffusers.utils import logging, replace_example_docstring

from ...families import get_model_family
from ...models.autoencoder_bsq import InfinityBSQVAE
from ...next_scale.context import VARForwardContext
from ...models.dtype_utils import compute_dtype
from ...models.group_offload import keeps_group_offload_residents, refuse_tied_leaf_disk_offload
from ...models.infinity_resolutions import rope_grid_hw, schedule_for_size
from ...models.transformer_infinity import (
    INFINITY_CONFIGS,
    InfinityCondition,
    InfinityTransformer,
    latent_bits_to_tokens,
    latent_to_tokens,
    tokens_to_latent_bits,
)
from ...schedulers.scheduling_var_base import VARAccelScheduler
from ..acceleration_mixin import VARAccelerationMixin
from ..lora_loading import VARLoraLoaderMixin
from ..preset_models import check_preset_model
from ..guidance import LiveGuidance
from ..input_checks import (
    check_generator,
    check_generator_count,
    check_max_sequence_length,
    check_output_type,
    check_per_scale,
    check_positive_int,
    check_prompt_argument,
    check_real,
    check_teacher_tokens,
    check_text_embeds,
    resolve_size,
    warn_if_truncated,
    warn_unused_negative,
)
from ..pipeline_common import NextScalePipelineMixin
from ..pipeline_loading import (
    check_loaded_pipeline,
    no_nested_progress_bars,
    prepare_pipeline_loading,
    save_pipeline_folder,
)
from ..sampling import DrawCheck, mask_top_k_top_p, sample_categorical
from ...next_scale import ScaleModelFamily, run_next_scale_loop
from ...next_scale.state import ScalePrediction, ScheduleTables, concat_scale_inputs, schedule_slice

logger = logging.get_logger(__name__)

#: The official T5 token limit (Infinity's ``text_maxlen``): ``encode_prompt``'s default in a pipeline without a
#: transformer.
INFINITY_TEXT_MAXLEN = INFINITY_CONFIGS["infinity-2b"]["text_maxlen"]

EXAMPLE_DOC_STRING = """
    Examples:
        ```py
        >>> import torch
        >>> from diffusers_var_accel import InfinityPipeline

        >>> pipe = InfinityPipeline.from_pretrained("path/to/infinity-2b-diffusers", dtype=torch.bfloat16).to("cuda")
        >>> image = pipe("a red fox in the snow", generator=torch.Generator("cuda").manual_seed(0)).images[0]
        ```
"""


def sample_bits(
    logits_BLV: torch.Tensor,
    top_k: int,
    top_p: Optional[float],
    generator: Union[None, torch.Generator, List[torch.Generator]],
    sampling: str = "device",
    check: Optional[DrawCheck] = None,
    scale_index: int = -1,
) -> torch.Tensor:
    """Sample every bit independently from its two logits (official ``sample_with_top_k_top_p``).

    ``logits_BLV`` is (B, L, 2d); per token the 2d outputs are d pairs (logit of 0, logit of 1). Top-k over the two
    classes (k=1 is greedy), then top-p (the minority bit is dropped when its probability is <= 1 - top_p), then one
    ``torch.multinomial`` over all bits of the batch, or one per image when a list of generators is given (or the
    same draws without host checks, ``sampling="device"``: see :func:`sample_categorical`). Sampling runs on the
    generator's device; ``check`` and ``scale_index`` as in :func:`sample_categorical`. Returns (B, L, d) int64
    bits.
    """
    B, L, V = logits_BLV.shape
    masked = mask_top_k_top_p(logits_BLV.reshape(B, -1, 2), top_k, top_p)
    return sample_categorical(masked, generator, sampling, check, scale_index).view(B, L, V // 2)


class InfinityScaleFamily(ScaleModelFamily):
    """Infinity's steps of the next-scale loop for one call: bitwise head, BSQ codes, 2D RoPE on the 1M grid."""

    family = "infinity"

    def __init__(
        self,
        transformer: InfinityTransformer,
        vae: InfinityBSQVAE,
        scale_schedule,
        grid_hw,
        top_k: int,
        top_p: Optional[float],
        sampling: str = "device",
        tables: Optional[ScheduleTables] = None,
    ):
        self.transformer, self.vae = transformer, vae
        self.sampling = sampling
        self.draw_check = DrawCheck()  # the device draws' multinomial check, read once after the loop
        self.scale_schedule = [tuple(s) for s in scale_schedule]
        self.num_layers = len(transformer.blocks)
        self.num_start_tokens = int(self.scale_schedule[0][-2]) * int(self.scale_schedule[0][-1])
        self.top_k, self.top_p = top_k, top_p
        # A token covers patch x patch latent positions (2 on the spatial-patchify / 8B path): tokens, logits and the
        # schedule are on the token grid, the summed codes f_hat on the VAE latent grid (patch times larger).
        self.patch = check_token_layout(transformer, vae)
        self.final_hw = tuple(self.patch * v for v in self.scale_schedule[-1][-2:])
        # One RoPE table for every token of the schedule; a pass takes the slice of its scales (the table is
        # element-wise in the positions, so slices equal per-scale tables).
        self._rope, self._rope_offsets = self._schedule_rope(
            transformer, self.scale_schedule, grid_hw, tables if tables is not None else ScheduleTables()
        )
        self._code_values = {}  # device -> the VAE's codes of a bit 0 / 1 (see _bit_code_values)
        self._head_modulations = {}  # head AdaLN terms per set of condition rows (see _head_logits)

    @staticmethod
    def _schedule_rope(
        transformer: InfinityTransformer, scale_schedule, grid_hw, tables: ScheduleTables
    ) -> Tuple[torch.Tensor, List[int]]:
        """``(cos/sin table of every token of the schedule, offset of each scale's first token)`` on the model's
        device. The table depends only on the schedule, the RoPE grid, the head size and the device, so it is kept in
        ``tables`` (the pipeline's :class:`ScheduleTables`: calls with the same ones share it; built on the device, no
        host data is uploaded); it is never written to."""
        device = transformer.pos_start.device
        head_dim = transformer.config.embed_dim // transformer.config.num_heads
        key = (
            "infinity.rope",
            type(transformer),
            tuple(tuple(int(v) for v in s) for s in scale_schedule),
            tuple(grid_hw),
            head_dim,
            device,
        )  # the class too: a subclass may compute its RoPE otherwise

        def build():
            positions = [transformer.rope_positions(s[-2], s[-1], grid_hw, device=device) for s in scale_schedule]
            lengths = [int(s[-2]) * int(s[-1]) for s in scale_schedule]
            return transformer.rope_cos_sin(torch.cat(positions)), [sum(lengths[:i]) for i in range(len(lengths) + 1)]

        return tables.get(key, build)

    # -- the six steps of the loop (ScaleModelFamily) -------------------------------------------------------------
    def start(self, condition: InfinityCondition) -> torch.Tensor:
        return self.transformer.embed_start(condition)

    def embed(self, f_hat, scale_indices, condition, scale_index_L):
        later = [si for si in scale_indices if si != 0]
        x_BLC = (
            self.embed_inputs(concat_scale_inputs([self.next_inputs(f_hat, si) for si in later]), scale_index_L)
            if later
            else None
        )
        return x_BLC, self.rope_cos_sin(scale_indices)

    def run_blocks(self, hidden_RLC, condition, context: VARForwardContext):
        return self.transformer(hidden_RLC, condition, context)

    def predict(
        self,
        hidden_RLC,
        condition: InfinityCondition,
        scale_index,
        *,
        batch_size,
        guidance,
        temperature,
        generator,
        residual_tokens=None,
        tokens=None,
    ) -> ScalePrediction:
        logits, raw = self.guided_logits(hidden_RLC, condition, scale_index, guidance, temperature, batch_size)
        if tokens is None:
            tokens = sample_bits(
                logits, self.top_k, self.top_p, generator, self.sampling, self.draw_check, scale_index
            )
        return ScalePrediction(tokens, self.tokens_to_codes(tokens, scale_index), raw)

    def add_codes(self, f_hat, codes, scale_index):
        if self.patch != 1:
            codes = F.pixel_shuffle(codes, self.patch)  # back to the VAE latent: f_hat is summed un-patchified
        return self.vae.add_scale_codes(
            f_hat, codes, self.final_hw, is_last_scale=scale_index == len(self.scale_schedule) - 1
        )

    def select_rows(self, condition: InfinityCondition, rows: slice) -> InfinityCondition:
        return condition.select_rows(rows)

    # -- Infinity's own parts of those steps ----------------------------------------------------------------------
    def embed_inputs(self, inputs_BLd: torch.Tensor, scale_index_L: torch.Tensor) -> torch.Tensor:
        """Embedded tokens ``(B, L, C)`` of later scales from their latent inputs (teacher-forced training feeds its
        own inputs here)."""
        # a no-op cast for inputs from next_inputs, which are already contiguous in this dtype
        return self.transformer.embed_scale_inputs(self._as_input(inputs_BLd), scale_index_L)

    def rope_cos_sin(self, scale_indices: Sequence[int]) -> torch.Tensor:
        """The RoPE tables of every token of ``scale_indices``, a slice of the schedule's table."""
        return schedule_slice(self._rope, self._rope_offsets, scale_indices, dim=3)

    def _as_input(self, x_BLd: torch.Tensor) -> torch.Tensor:
        """``word_embed``'s dtype, contiguous: one kernel for the cast and the copy of the interpolation's transposed
        view (what the loop's concatenation then the cast gave, in one kernel instead of two)."""
        return x_BLd.to(compute_dtype(self.transformer.word_embed), memory_format=torch.contiguous_format)

    def _head_logits(self, hidden_RLC, cond_RC):
        """The head on these rows, its AdaLN terms computed once per call for each set of condition rows (the rows
        are views of the call's condition, so their address and shape name them)."""
        key = (cond_RC.data_ptr(), tuple(cond_RC.shape), cond_RC.stride())
        modulation = self._head_modulations.get(key)
        if modulation is None:
            modulation = self._head_modulations[key] = self.transformer.head_modulation(cond_RC)
        return self.transformer.head_logits(hidden_RLC, head_modulation=modulation)

    def guided_logits(
        self, hidden_RLC, condition: InfinityCondition, scale_index, guidance_scale, temperature, batch_size
    ):
        """``(logits to sample from, raw head output)`` at one scale: temperature and guidance applied to the first
        (guidance off, ``guidance_scale`` 1: the head runs on the conditional rows only)."""
        B = batch_size
        inverse_temperature = 1 / temperature
        if guidance_scale != 1:
            raw = self._head_logits(hidden_RLC, condition.cond_RC)
            if _is_exact_gain(inverse_temperature):
                # g * (raw * 2^k) == (g * 2^k) * raw bit for bit (scaling by a power of two is exact and commutes
                # with rounding), so the temperature folds into the two guidance weights: one kernel less.
                return (guidance_scale * inverse_temperature) * raw[:B] + (
                    (1 - guidance_scale) * inverse_temperature
                ) * raw[B:], raw
            scaled = raw.mul(inverse_temperature)
            return guidance_scale * scaled[:B] + (1 - guidance_scale) * scaled[B:], raw
        raw = self._head_logits(hidden_RLC[:B], condition.cond_RC[:B])
        # tau = 1 would multiply by 1.0 (exact): the raw logits are the logits (nothing writes to either)
        return (raw if inverse_temperature == 1 else raw.mul(inverse_temperature)), raw

    def tokens_to_codes(self, tokens, scale_index):
        """Codes on the token grid, ``(B, p*p*d, h, w)``: with patchify the VAE's codes of the un-patchified bits,
        patchified again, so that a plan that masks or weights tokens (zero residual, code weights) sees one cell per token."""
        _, h, w = (1, *self.scale_schedule[scale_index][-2:])
        if self.patch == 1:
            bits = tokens.reshape(tokens.shape[0], h, w, -1)
            return self.vae.bits_to_codes(bits, bit_code_values=self._bit_code_values(bits.device))
        bits = tokens_to_latent_bits(tokens.reshape(tokens.shape[0], h * w, -1), (h, w), self.patch)
        return F.pixel_unshuffle(self.vae.bits_to_codes(bits), self.patch)

    def _bit_code_values(self, device: torch.device) -> torch.Tensor:
        """The VAE's fp32 codes of a bit 0 / 1, once per call and device (see ``InfinityBSQVAE.bits_to_codes``)."""
        values = self._code_values.get(device)
        if values is None:
            values = self._code_values[device] = self.vae.bit_code_values(torch.float32, device)
        return values

    def next_inputs(self, f_hat, scale_index):
        """The interpolated latent of the scale in the transformer's input dtype, contiguous (see ``_as_input``)."""
        h, w = self.scale_schedule[scale_index][-2:]
        if self.patch == 1:
            return self._as_input(self.vae.next_scale_input(f_hat, (h, w)))
        # interpolated at VAE resolution, then patchified (not the same as interpolating patchified codes)
        ph, pw = self.patch * h, self.patch * w
        x_Bld = self.vae.next_scale_input(f_hat, (ph, pw))
        return self._as_input(latent_to_tokens(x_Bld.transpose(1, 2).reshape(x_Bld.shape[0], -1, ph, pw), self.patch))

    def teacher_tokens(self, bits: torch.Tensor, scale_index: int) -> torch.Tensor:
        """Teacher bits of one scale as the loop's tokens ``(B, h*w, bits per token)`` (int64).

        Accepted: the token layout ``(B, h*w, p*p*d)`` (or ``(B, 1, h, w, p*p*d)``), or, with patchify, the VAE layout
        ``(B, 1, p*h, p*w, d)`` of the official ``gt_ls_Bl`` (what ``InfinityBSQVAE.quantize_multiscale`` returns).
        """
        if scale_index >= len(self.scale_schedule):
            raise ValueError(
                f"got teacher bits for scale {scale_index}, but the schedule has {len(self.scale_schedule)} scales"
            )
        h, w = self.scale_schedule[scale_index][-2:]
        bits_per_token, d = self.transformer.config.codebook_dim, self.vae.config.codebook_dim
        if self.patch != 1 and bits.shape[-1] == d and bits.ndim >= 4:
            if tuple(bits.shape[-3:-1]) != (self.patch * h, self.patch * w):
                raise ValueError(
                    f"teacher bits of scale {scale_index} in the VAE layout must be (B, 1, {self.patch * h}, "
                    f"{self.patch * w}, {d}), got {tuple(bits.shape)}"
                )
            bits = latent_bits_to_tokens(bits, self.patch)
        if bits.shape[-1] != bits_per_token or bits.numel() != bits.shape[0] * h * w * bits_per_token:
            raise ValueError(
                f"teacher bits of scale {scale_index} must be (B, {h * w}, {bits_per_token}) or (B, 1, {h}, {w}, "
                f"{bits_per_token})"
                + (f" or (B, 1, {self.patch * h}, {self.patch * w}, {d})" if self.patch != 1 else "")
                + f", got {tuple(bits.shape)}"
            )
        return bits.reshape(bits.shape[0], h * w, bits_per_token).long()


def _is_exact_gain(value: float) -> bool:
    """Whether ``value`` is ``2**k`` with ``0 <= k <= 16``: multiplying a logit (or a guidance weight) by it is exact
    (no rounding, no underflow; overflow would need logits beyond 1e33), so it commutes with any later product."""
    mantissa, exponent = math.frexp(value)
    return mantissa == 0.5 and 1 <= exponent <= 17


def check_token_layout(transformer: InfinityTransformer, vae: InfinityBSQVAE) -> int:
    """The latent patch side of a token (1, or 2 with ``apply_spatial_patchify``), checked against the VAE's bits.

    Raises:
        ValueError: the transformer's bits per token are not ``patch**2`` times the VAE's ``codebook_dim``.
    """
    patch = transformer.token_patch_size
    bits, d = transformer.config.codebook_dim, vae.config.codebook_dim
    if bits != patch * patch * d:
        hint = (
            " (a patchify transformer needs the patch-8 d56-style VAE)"
            if patch != 1
            else "; a transformer with 4x the VAE's bits needs apply_spatial_patchify=True"
            if bits == 4 * d
            else ""
        )
        raise ValueError(
            f"the transformer predicts {bits} bits per token (apply_spatial_patchify="
            f"{patch != 1}) but the VAE has codebook_dim={d}: expected {patch * patch * d} bits{hint}"
        )
    return patch


class InfinityTextInputs(NamedTuple):
    """A call's text inputs as given to :meth:`InfinityPipeline.__call__` (checked together by ``check_inputs``)."""

    prompt: Union[str, List[str], None] = None
    negative_prompt: Union[str, List[str], None] = None
    prompt_embeds: Optional[torch.Tensor] = None
    negative_prompt_embeds: Optional[torch.Tensor] = None
    prompt_attention_mask: Optional[torch.Tensor] = None
    negative_prompt_attention_mask: Optional[torch.Tensor] = None
    max_sequence_length: Optional[int] = None


class InfinitySampling(NamedTuple):
    """A call's sampling arguments as given to :meth:`InfinityPipeline.__call__` (checked by ``check_inputs``,
    compared with a calibration's)."""

    guidance_scale: float
    cfg_list: Optional[Sequence[float]]
    tau: float
    tau_list: Optional[Sequence[float]]
    top_k: int
    top_p: Optional[float]


class InfinityPipeline(DiffusionPipeline, NextScalePipelineMixin, VARAccelerationMixin, VARLoraLoaderMixin):
    r"""Text-to-image generation with Infinity (arXiv:2412.04431).

    Args:
        transformer ([`InfinityTransformer`]): the bitwise next-scale transformer.
        vae ([`InfinityBSQVAE`]): the BSQ tokenizer; its decoder turns the summed codes into pixels.
        text_encoder ([`~transformers.T5EncoderModel`] or `None`): flan-t5-xl's encoder for the real model.
        tokenizer ([`~transformers.PreTrainedTokenizerBase`] or `None`): the T5 tokenizer.
        acceleration ([`VARAccelScheduler`], *optional*): an acceleration scheduler used by every call (see
            `enable_acceleration`); saved in `acceleration/`.
        max_sequence_length (`int`, *optional*): the T5 token limit of `encode_prompt` (stored in the pipeline's
            configuration, `model_index.json`); by default the transformer's `text_maxlen`, or the official 512 in a
            pipeline without a transformer, capped by the tokenizer's `model_max_length`.
        preset_model (`str`, *optional*): the model whose packaged presets `enable_<method>()` and method names use
            (stored in `model_index.json`, so a saved copy keeps it): the embedded model's folder sets
            `"embedded"`; `None` (the default) uses the family's. It must have presets for this family.

    The text encoder and tokenizer are components every prompt needs, as in diffusers' text-to-image pipelines: pass
    ``text_encoder=None, tokenizer=None`` for a pipeline that runs from ``prompt_embeds`` only (``from_pretrained``
    of a folder saved without them keeps them ``None`` by itself). ``acceleration`` is the one optional component.
    """

    model_family = "infinity"
    model_cpu_offload_seq = "text_encoder->transformer->vae"
    _optional_components = ["acceleration"]
    sampling_arguments = ("guidance_scale", "tau", "top_k", "top_p")
    _callback_tensor_inputs = ["latents", "tokens", "logits", "prompt_embeds"]

    def __init__(
        self,
        transformer: InfinityTransformer,
        vae: InfinityBSQVAE,
        text_encoder,
        tokenizer,
        acceleration: Optional[VARAccelScheduler] = None,
        max_sequence_length: Optional[int] = None,
        preset_model: Optional[str] = None,
    ):
        super().__init__()
        check_max_sequence_length(max_sequence_length)
        check_preset_model(preset_model, self.model_family)
        if acceleration is not None:
            acceleration.check_model_family(self.model_family)
        if transformer is not None and vae is not None:  # either may be absent (encode_prompt alone needs neither)
            check_token_layout(transformer, vae)  # bits per token = VAE bits (x4 on the spatial-patchify / 8B path)
        self.register_modules(
            transformer=transformer, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, acceleration=acceleration
        )
        self.register_to_config(max_sequence_length=max_sequence_length, preset_model=preset_model)
        # vae may be None (a text-encoding-only pipeline: encode_prompt); the factor only matters for resizing, which is off
        self.image_processor = VaeImageProcessor(
            vae_scale_factor=int(vae.config.patch_size) if vae is not None else 16, do_resize=False
        )
        self._interrupt = False

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        """``DiffusionPipeline.from_pretrained``; the names ``"embedded"`` / ``"shapes-infinity-tiny"`` load the
        packaged embedded model (offline). ``dtype`` (or its older name ``torch_dtype``) may be a ``torch.dtype`` or
        its name (``"bfloat16"``). A folder or repo with our Hub shim (``hub.write_hub_shim``) loads without
        ``trust_remote_code``.

        Raises:
            FileNotFoundError: a name close to a packaged one (the message suggests it), or a component folder is missing.
            ValueError: ``model_index.json`` names another or a non-existent class, a weights file is empty or
                truncated, or a component's weights do not match its ``config.json`` (the files and keys are named).
        """
        from ...embedded import EMBEDDED_MODEL_NAMES, embedded_model_path
        from ...hub import holds_own_shim

        path, kwargs = prepare_pipeline_loading(
            cls, pretrained_model_name_or_path, kwargs, {name: embedded_model_path for name in EMBEDDED_MODEL_NAMES}
        )
        if not kwargs.get("trust_remote_code") and holds_own_shim(path, cls.__name__, **kwargs):
            kwargs["trust_remote_code"] = True  # the only code is our one-line import of this class, checked above
        with no_nested_progress_bars():
            pipe = super().from_pretrained(path, **kwargs)
        check_loaded_pipeline(pipe, path, passed=list(kwargs))
        return pipe

    def save_pretrained(self, save_directory, *args, **kwargs) -> None:
        """``DiffusionPipeline.save_pretrained``, all or nothing: the whole folder is written beside ``save_directory``
        and swapped in by two renames, so a process killed while saving leaves the earlier pipeline or this one, never a
        mix of both and never neither (:func:`~diffusers_var_accel.pipelines.pipeline_loading.save_pipeline_folder`)."""
        save_pipeline_folder(self, save_directory, args, kwargs)

    def enable_group_offload(self, *args, **kwargs) -> None:
        """diffusers' ``DiffusionPipeline.enable_group_offload`` (same arguments). Each call keeps the weights the
        loop reads outside a ``forward`` on the device (:mod:`~diffusers_var_accel.models.group_offload`); a
        leaf-level disk offload of a component with tied layers (T5's embeddings) is refused before anything is
        hooked.

        Raises:
            ValueError: for a leaf-level disk offload of a component with tied layers, or diffusers' own errors
                (``use_stream=True`` on a device without streams).
        """
        refuse_tied_leaf_disk_offload(self, *args, **kwargs)
        super().enable_group_offload(*args, **kwargs)

    # 1. text -----------------------------------------------------------------------------------------------------
    def text_token_limit(self) -> int:
        """The T5 token limit of :meth:`encode_prompt`: the pipeline's configured ``max_sequence_length``, else the
        transformer's ``text_maxlen`` (the official 512 without a transformer), capped by the tokenizer's
        ``model_max_length``."""
        limit = getattr(self.config, "max_sequence_length", None)
        if limit is None:
            limit = self.transformer.config.text_maxlen if self.transformer is not None else INFINITY_TEXT_MAXLEN
        tokenizer_limit = getattr(self.tokenizer, "model_max_length", None) or limit
        return int(min(limit, tokenizer_limit))

    def encode_prompt(
        self,
        prompt: Union[str, List[str]],
        device: Optional[torch.device] = None,
        num_images_per_prompt: int = 1,
        max_sequence_length: Optional[int] = None,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """T5 features of the prompts, padded to the longest: ``(prompt_embeds (B, T, D), prompt_attention_mask (B, T))``,
        the arguments of the same names of ``__call__`` (for a negative prompt, pass the two outputs of its encoding as
        ``negative_prompt_embeds`` / ``negative_prompt_attention_mask``).

        Only the text encoder and tokenizer are used (the VAE and the transformer may be absent; the token limit is
        :meth:`text_token_limit` unless ``max_sequence_length`` is given). Only the unpadded tokens matter downstream
        (the official code keeps ``mask.sum()`` tokens per prompt).
        """
        if self.text_encoder is None or self.tokenizer is None:
            raise ValueError(
                "this pipeline has no text_encoder/tokenizer: pass prompt_embeds and prompt_attention_mask instead of prompt"
            )
        check_prompt_argument("prompt", prompt, required=True)
        check_positive_int("num_images_per_prompt", num_images_per_prompt)
        check_max_sequence_length(max_sequence_length)
        device = device or self._execution_device
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        max_len = self.text_token_limit() if max_sequence_length is None else int(max_sequence_length)
        warn_if_truncated(self.tokenizer, prompts, max_len, "max_sequence_length")
        tokens = self.tokenizer(prompts, max_length=max_len, padding="longest", truncation=True, return_tensors="pt")
        input_ids, mask = tokens.input_ids.to(device), tokens.attention_mask.to(device)
        embeds = self.text_encoder(input_ids=input_ids, attention_mask=mask).last_hidden_state.float()
        prompt_embeds = embeds.repeat_interleave(num_images_per_prompt, dim=0)
        prompt_attention_mask = mask.repeat_interleave(num_images_per_prompt, dim=0).bool()
        return prompt_embeds, prompt_attention_mask

    def scale_schedule_for(self, height: int, width: int):
        """The ``(1, h, w)`` schedule that produces ``height x width`` pixels and the grid its RoPE positions live on.

        Official models: one of the 15 aspect templates x 4 pixel budgets (RoPE on the template's 1M grid). A model
        trained for one fixed schedule (``transformer.config.scale_schedule``) makes exactly one size.

        Raises:
            ValueError: the size is not supported; the message lists the supported sizes.
        """
        fixed = self.transformer.config.get("scale_schedule")
        if fixed:
            schedule = tuple(tuple(int(v) for v in s) for s in fixed)
            patch = self.pixels_per_token
            _, h, w = schedule[-1]
            if (height, width) != (h * patch, w * patch):
                raise ValueError(
                    f"height x width = {height}x{width} is not supported: this model was trained for one "
                    f"schedule and makes {h * patch}x{w * patch} images only"
                )
            return schedule, (h, w)
        schedule, template = schedule_for_size(height, width)
        return schedule, rope_grid_hw(template)

    def guided_call(self, guidance_scale: Optional[float] = None, cfg_list: Optional[Sequence[float]] = None) -> bool:
        """Whether a call with these guidance arguments (`None`: the call's default) runs the unconditional CFG rows
        (a scale not 1)."""
        if guidance_scale is None:
            guidance_scale = self.call_default("guidance_scale")
        scales = cfg_list if cfg_list is not None else [guidance_scale]
        return any(float(g) != 1 for g in scales)

    def _kv_cache_layout(self, height: Optional[int], width: Optional[int]):
        """The schedule of a call of ``height x width`` and its start tokens (one per scale-0 token), for
        :meth:`kv_cache_bytes`."""
        default_h, default_w = self.default_size
        schedule, _ = self.scale_schedule_for(height or default_h, width or default_w)
        return schedule, int(schedule[0][-2]) * int(schedule[0][-1])

    @property
    def pixels_per_token(self) -> int:
        """Image pixels per token along each axis: the VAE's patch size times the token's latent patch (2 on the
        spatial-patchify path: 8 x 2 = 16 px for Infinity-8B, as 16 x 1 for Infinity-2B)."""
        return int(self.vae.config.patch_size) * self.transformer.token_patch_size

    @property
    def default_size(self) -> Tuple[int, int]:
        """``(height, width)`` used when none is given: the fixed schedule's size, else 1024 x 1024."""
        fixed = self.transformer.config.get("scale_schedule")
        if fixed:
            patch = self.pixels_per_token
            return fixed[-1][1] * patch, fixed[-1][2] * patch
        return 1024, 1024

    # 2. checks ---------------------------------------------------------------------------------------------------
    def check_inputs(
        self,
        text: "InfinityTextInputs",
        sampling: "InfinitySampling",
        height: int,
        width: int,
        num_scales: int,
        num_images_per_prompt=1,
        generator=None,
        output_type="pil",
        callback_on_step_end_tensor_inputs=None,
    ):
        """Raise a ``ValueError`` (``InputTypeError``, also a ``TypeError``, for a wrong type) naming the first bad
        argument, its value and what is allowed."""
        prompt, negative_prompt, prompt_embeds, negative_prompt_embeds = text[:4]
        prompt_attention_mask, negative_prompt_attention_mask, max_sequence_length = text[4:]
        guidance_scale, cfg_list, tau, tau_list, top_k, top_p = sampling
        if (prompt is None) == (prompt_embeds is None):
            raise ValueError("pass exactly one of prompt or prompt_embeds")
        check_prompt_argument("prompt", prompt)
        check_prompt_argument("negative_prompt", negative_prompt)
        width_D = int(self.transformer.config.text_channels)
        check_text_embeds("prompt_embeds", prompt_embeds, width_D)
        check_text_embeds("negative_prompt_embeds", negative_prompt_embeds, width_D)
        for name, mask, embeds in (
            ("prompt_attention_mask", prompt_attention_mask, prompt_embeds),
            ("negative_prompt_attention_mask", negative_prompt_attention_mask, negative_prompt_embeds),
        ):
            if mask is None:
                continue
            if embeds is None:
                raise ValueError(
                    f"{name} goes with {name.replace('attention_mask', 'embeds')}; with a prompt it comes from its tokenization"
                )
            if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != tuple(embeds.shape[:2]):
                shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
                raise ValueError(
                    f"{name} shape {shape} != {name.replace('attention_mask', 'embeds')} (batch, tokens) {tuple(embeds.shape[:2])}"
                )
        if negative_prompt is not None and negative_prompt_embeds is not None:
            raise ValueError("pass at most one of negative_prompt and negative_prompt_embeds")
        check_positive_int("num_images_per_prompt", num_images_per_prompt)
        check_generator("generator", generator)
        check_output_type(output_type)
        check_max_sequence_length(max_sequence_length)
        schedule_text = f"the {height}x{width} schedule"
        check_real("guidance_scale", guidance_scale, 0, rule=" (1 disables CFG)")
        if cfg_list is not None:
            check_per_scale("cfg_list", cfg_list, num_scales, 0, schedule_text=schedule_text)
        if tau_list is not None:
            check_per_scale(
                "tau_list",
                tau_list,
                num_scales,
                0,
                strictly_above=True,
                rule=" (temperature tau)",
                schedule_text=schedule_text,
            )
        else:
            check_real("tau", tau, 0, strictly_above=True, rule=" (temperature tau)")
        if top_p is not None:
            check_real("top_p", top_p, rule=" in (0, 1]")
            if not (0 < top_p <= 1):
                raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        if top_k is not None:
            check_real("top_k", top_k, rule=" (an integer >= 0; 0 disables it)")
            if int(top_k) != top_k or top_k < 0:
                raise ValueError(f"top_k must be an integer >= 0 (0 disables it), got {top_k}")
        bad = [k for k in (callback_on_step_end_tensor_inputs or []) if k not in self._callback_tensor_inputs]
        if bad:
            raise ValueError(f"callback_on_step_end_tensor_inputs {bad} are not in {self._callback_tensor_inputs}")

    # 4. call -----------------------------------------------------------------------------------------------------
    @torch.no_grad()
    @replace_example_docstring(EXAMPLE_DOC_STRING)
    @keeps_group_offload_residents
    def __call__(
        self,
        prompt: Union[str, List[str], None] = None,
        negative_prompt: Union[str, List[str], None] = None,
        height: Optional[int] = None,
        width: Optional[int] = None,
        guidance_scale: float = 4.0,
        cfg_list: Optional[Sequence[float]] = None,
        tau: float = 0.5,
        tau_list: Optional[Sequence[float]] = None,
        top_k: int = 900,
        top_p: Optional[float] = 0.97,
        num_images_per_prompt: int = 1,
        generator: Union[torch.Generator, List[torch.Generator], None] = None,
        prompt_embeds: Optional[torch.Tensor] = None,
        prompt_attention_mask: Optional[torch.Tensor] = None,
        negative_prompt_embeds: Optional[torch.Tensor] = None,
        negative_prompt_attention_mask: Optional[torch.Tensor] = None,
        teacher_tokens: Optional[Sequence[torch.Tensor]] = None,
        acceleration: Optional[VARAccelScheduler] = None,
        output_type: str = "pil",
        return_dict: bool = True,
        callback_on_step_end: Optional[
            Callable[["InfinityPipeline", int, Tuple[int, ...], Dict[str, Any]], Dict[str, Any]]
        ] = None,
        callback_on_step_end_tensor_inputs: Sequence[str] = ("latents",),
        max_sequence_length: Optional[int] = None,
    ):
        r"""Generate images from text.

        Args:
            prompt (`str` or `List[str]`, *optional*): the prompt(s); or pass `prompt_embeds`. `""` is encoded like
                any text, as diffusers' pipelines do (the command line refuses an empty prompt).
            negative_prompt (`str` or `List[str]`, *optional*): T5 features of this text replace the learned
                unconditional embedding in the CFG rows.
            height (`int`, *optional*): with `width`, one of the official sizes (15 aspect ratios x 4 pixel budgets;
                default 1024 x 1024), or the one size of a model trained for a fixed schedule (its default); others
                raise an error that lists the supported sizes.
            width (`int`, *optional*): see `height`.
            guidance_scale (`float`, *optional*, defaults to 4.0): CFG scale for every scale (1 disables CFG).
            cfg_list (`List[float]`, *optional*): one guidance scale per scale; overrides `guidance_scale`.
            tau (`float`, *optional*, defaults to 0.5): sampling temperature for every scale.
            tau_list (`List[float]`, *optional*): one sampling temperature per scale; overrides `tau`.
            top_k (`int`, *optional*, defaults to 900): top-k over the 2 classes of each bit (1 = greedy, 0 = off).
            top_p (`float`, *optional*, defaults to 0.97): nucleus threshold in (0, 1]; `None` disables it.
            num_images_per_prompt (`int`, *optional*, defaults to 1): images per prompt.
            generator (`torch.Generator` or `List[torch.Generator]`, *optional*): one generator samples the whole
                batch in one draw per scale (as the official code); a list (one per image) makes each image
                independent of the batch it is in.
            prompt_embeds (`torch.Tensor`, *optional*): T5 features (B, T, D) bypassing the text encoder, with
                `prompt_attention_mask` (B, T) marking the valid tokens (all valid when omitted).
            negative_prompt_embeds (`torch.Tensor`, *optional*): likewise, for the unconditional rows.
            negative_prompt_attention_mask (`torch.Tensor`, *optional*): the mask of `negative_prompt_embeds`.
            teacher_tokens (`List[torch.Tensor]`, *optional*): bits (B, 1, h, w, d) used instead of sampling at the
                first `len(teacher_tokens)` scales (teacher forcing, as the official `gt_leak`). On the
                spatial-patchify path either layout: the VAE's (B, 1, 2h, 2w, d) or the tokens' (B, h*w, 4d).
            acceleration (`VARAccelScheduler` or `str`, *optional*): accelerate this call only (overrides the attached
                one); a method name or names joined with ``"+"`` as in ``enable_acceleration``.
            output_type (`str`, *optional*, defaults to `"pil"`): `"pil"`, `"np"`, `"pt"` or `"latent"` (the
                summed codes, (B, d, H, W) on the VAE latent grid: twice the last token map per side on the
                spatial-patchify path).
            return_dict (`bool`, *optional*, defaults to `True`): return an `ImagePipelineOutput` or a tuple.
            callback_on_step_end (`Callable`, *optional*): called after each scale as
                `callback(pipe, scale_index, scale, callback_kwargs)`; may return a new `latents`, and may set
                `pipe._guidance_scale` (a number, or one guidance scale per scale) for the scales that follow.
            callback_on_step_end_tensor_inputs (`List[str]`, *optional*): names from `_callback_tensor_inputs`.
            max_sequence_length (`int`, *optional*): T5 token limit (default: the transformer's `text_maxlen`).

        Examples:

        Returns:
            [`~diffusers.pipelines.pipeline_utils.ImagePipelineOutput`] or `tuple`: the images in its `images` field,
                or the tuple `(images,)` when `return_dict` is `False`.
        """
        # 1. Schedule and input checks
        height, width = resolve_size(height, width, self.default_size)
        scale_schedule, grid_hw = self.scale_schedule_for(height, width)
        num_scales = len(scale_schedule)
        sampling = InfinitySampling(guidance_scale, cfg_list, tau, tau_list, top_k, top_p)
        text = InfinityTextInputs(
            prompt,
            negative_prompt,
            prompt_embeds,
            negative_prompt_embeds,
            prompt_attention_mask,
            negative_prompt_attention_mask,
            max_sequence_length,
        )
        self.check_inputs(
            text,
            sampling,
            height,
            width,
            num_scales,
            num_images_per_prompt,
            generator,
            output_type,
            callback_on_step_end_tensor_inputs,
        )
        cfg = [float(c) for c in cfg_list] if cfg_list is not None else [float(guidance_scale)] * num_scales
        taus = [float(t) for t in tau_list] if tau_list is not None else [float(tau)] * num_scales
        self._guidance_scale = cfg if cfg_list is not None else float(guidance_scale)
        self._num_timesteps, self._interrupt = num_scales, False
        # a callback may change it between scales
        cfg = LiveGuidance(
            self, num_scales, lambda g, n: [g] * n, no_guidance=get_model_family(self.model_family).no_guidance
        )
        scheduler = self._acceleration_for_call(acceleration)
        self._warn_if_sampling_differs_from_calibration(scheduler, sampling._asdict())
        device = self._execution_device

        # 2. Text conditioning: conditional rows, then unconditional rows when any scale is guided
        if prompt_embeds is None:
            prompt_embeds, prompt_attention_mask = self.encode_prompt(
                prompt, device, num_images_per_prompt, max_sequence_length
            )
        else:
            prompt_embeds = prompt_embeds.to(device).float().repeat_interleave(num_images_per_prompt, dim=0)
            if prompt_attention_mask is None:
                prompt_attention_mask = torch.ones(prompt_embeds.shape[:2], dtype=torch.bool, device=device)
            prompt_attention_mask = (
                prompt_attention_mask.to(device).bool().repeat_interleave(num_images_per_prompt, dim=0)
            )
        batch_size = prompt_embeds.shape[0]
        check_generator_count("generator", generator, batch_size)
        text, mask = prompt_embeds, prompt_attention_mask
        warn_unused_negative(
            negative_prompt, negative_prompt_embeds, all(c == 1 for c in cfg), "every guidance scale is 1"
        )
        if any(c != 1 for c in cfg):
            if negative_prompt is not None:
                negatives = (
                    [negative_prompt] * (batch_size // num_images_per_prompt)
                    if isinstance(negative_prompt, str)
                    else negative_prompt
                )
                if len(negatives) * num_images_per_prompt != batch_size:
                    raise ValueError(
                        f"negative_prompt has {len(negatives)} entries for {batch_size // num_images_per_prompt} prompts"
                    )
                neg, neg_mask = self.encode_prompt(negatives, device, num_images_per_prompt, max_sequence_length)
            elif negative_prompt_embeds is not None:
                neg = negative_prompt_embeds.to(device).float().repeat_interleave(num_images_per_prompt, dim=0)
                neg_mask = (
                    (
                        negative_prompt_attention_mask
                        if negative_prompt_attention_mask is not None
                        else torch.ones(negative_prompt_embeds.shape[:2], dtype=torch.bool)
                    )
                    .to(device)
                    .bool()
                    .repeat_interleave(num_images_per_prompt, dim=0)
                )
                if neg.shape[0] != batch_size:
                    raise ValueError(
                        f"negative_prompt_embeds has {neg.shape[0] // num_images_per_prompt} rows for {batch_size // num_images_per_prompt} prompts"
                    )
            else:
                neg, neg_mask = self.transformer.null_text_embeds(mask).to(text.dtype), mask
            text, mask = _concat_padded((text, mask), (neg, neg_mask))
        # Half-precision weights run under autocast, as the official bf16 inference does (norms and AdaLN in fp32).
        dtype = self.transformer.dtype
        autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype in (torch.float16, torch.bfloat16))
        with autocast:
            condition = self.transformer.encode_condition(text, mask)

        # 3. The next-scale loop
        family = InfinityScaleFamily(
            self.transformer,
            self.vae,
            scale_schedule,
            grid_hw,
            top_k,
            top_p,
            self.sampling,
            tables=self.schedule_tables,
        )
        if teacher_tokens is not None:
            bits = int(self.transformer.config.codebook_dim)  # per token: p*p*d with spatial patchify
            check_teacher_tokens(
                teacher_tokens,
                [(batch_size, 1, h, w, bits) for _, h, w in scale_schedule],
                [f"({batch_size}, {h * w}, {bits})" for _, h, w in scale_schedule],
                integer_range=(0, 1),
            )
            teacher_tokens = [family.teacher_tokens(t.to(device), si) for si, t in enumerate(teacher_tokens)]
        progress = self.progress_bar(total=num_scales)

        on_scale_end = self._scale_callback(
            callback_on_step_end, callback_on_step_end_tensor_inputs, scale_schedule, prompt_embeds, progress
        )

        with progress, autocast:
            state = run_next_scale_loop(
                family,
                condition,
                scale_schedule,
                batch_size,
                cfg,
                taus,
                generator,
                scheduler,
                teacher_tokens,
                on_scale_end,
                should_stop=lambda: self._interrupt,
                pass_runner=self._pass_runner,
                tables=self.schedule_tables,
                kv_cache_dtype=self.kv_cache_dtype,
            )
        latents = state.f_hat
        self._last_call_work = state.work  # acceleration_summary(): what this call's passes computed
        del state  # its KV cache (up to gigabytes) is freed before the decoder's buffers are allocated

        # 4. Decode
        return self._decode_output(
            latents,
            output_type,
            return_dict,
            per_image=isinstance(generator, (list, tuple)),
            draw_check=family.draw_check,
        )


def _concat_padded(
    a: Tuple[torch.Tensor, torch.Tensor], b: Tuple[torch.Tensor, torch.Tensor]
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Stack two (embeds, mask) row sets padded to a common token count (padding is masked out)."""
    T = max(a[0].shape[1], b[0].shape[1])

    def pad(embeds, mask):
        extra = T - embeds.shape[1]
        if extra == 0:
            return embeds, mask
        return (
            torch.nn.functional.pad(embeds, (0, 0, 0, extra)),
            torch.nn.functional.pad(mask, (0, extra), value=False),
        )

    (e1, m1), (e2, m2) = pad(*a), pad(*b)
    return torch.cat((e1, e2.to(e1.dtype))), torch.cat((m1, m2))


# a folder whose model_index.json names InfinityPipeline loads through DiffusionPipeline.from_pretrained as soon as this
# module is imported, whichever way it was reached
from ..diffusers_registration import register_pipelines_with_diffusers  # noqa: E402

register_pipelines_with_diffusers(InfinityPipeline)
