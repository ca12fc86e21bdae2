"""Text-to-image generation with HART (hybrid autoregressive transformer), through the shared next-scale loop."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
from diffusers.image_processor import VaeImageProcessor
from diffusers.pipelines.pipeline_utils import DiffusionPipeline
from diffusers.utils import logging, replace_example_docstring

from ...families import get_model_family
from ...models.autoencoder_hart import HARTHybridTokenizer
from ...models.dtype_utils import compute_dtype
from ...models.group_offload import keeps_group_offload_residents, refuse_tied_leaf_disk_offload
from ...next_scale.context import VARForwardContext
from ...next_scale.executor import on_computed_tokens
from ...models.transformer_hart import HART_CONFIGS, HARTCondition, HARTTransformer
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
    InputTypeError,
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
from ...next_scale import ScaleModelFamily, ScalePrediction, run_next_scale_loop
from ...next_scale.state import concat_scale_inputs, schedule_slice

logger = logging.get_logger(__name__)

#: The official text context length (HART-0.7B's ``context_tokens``): ``encode_prompt``'s default in a pipeline
#: without a transformer.
HART_CONTEXT_TOKENS = HART_CONFIGS["hart-0.7b"]["context_tokens"]

EXAMPLE_DOC_STRING = """
    Examples:
        ```py
        >>> import torch
        >>> from diffusers_var_accel import HARTPipeline

        >>> pipe = HARTPipeline.from_pretrained("path/to/hart-0.7b-diffusers").to("cuda")
        >>> image = pipe("a red fox in the snow", generator=torch.Generator("cuda").manual_seed(0)).images[0]
        ```
"""

#: The instruction the official code prepends to every prompt before running Qwen2 (``use_llm_system_prompt``,
#: default on); only the features of the prompt's own tokens are kept. Reproduced verbatim: it changes the features.
HART_LLM_SYSTEM_PROMPT = """Given a user prompt, generate an "Enhanced prompt" that provides detailed visual descriptions suitable for image generation.

Examples:
- User Prompt: A cat sleeping -> A small, fluffy white cat curled up in a round shape, sleeping peacefully on a warm sunny windowsill, surrounded by pots of blooming red flowers.
- User Prompt: A busy city street -> A bustling city street scene at dusk, featuring glowing street lamps, a diverse crowd of people in colorful clothing, and a double-decker bus passing by towering glass skyscrapers.

Please generate only the enhanced description for the prompt below and DO NOT include any additional sentences. Start your response with "Enhanced Prompt:".

User Prompt:\n"""


def hart_default_top_k(scale_index: int) -> int:
    """The official sampler's top-k: 600 for the first seven scales, 300 after (its ``top_k`` argument is ignored)."""
    return 600 if scale_index < 7 else 300


def gumbel_soft_weights(logits_BLV: torch.Tensor, tau: float, generator) -> torch.Tensor:
    """``softmax((logits + Gumbel) / tau)`` with the Gumbel noise drawn as ``-log(Exp(1))`` from ``generator``."""
    B = logits_BLV.shape[0]
    if isinstance(generator, (list, tuple)):
        gumbels = torch.cat([_exponential(logits_BLV[b : b + 1], generator[b]) for b in range(B)])
    else:
        gumbels = _exponential(logits_BLV, generator)
    return ((logits_BLV + gumbels.neg_()) / tau).softmax(dim=-1)


def _exponential(like: torch.Tensor, generator: Optional[torch.Generator]) -> torch.Tensor:
    device = generator.device if generator is not None else like.device
    draws = torch.empty(like.shape, dtype=like.dtype, device=device).exponential_(generator=generator)
    return draws.log().to(like.device)


class HARTScaleFamily(ScaleModelFamily):
    """HART's steps of the next-scale loop for one call.

    The context tokens are the start tokens (scale 0 is predicted from the last one); image tokens get per-row 2D
    RoPE; tokens become codebook vectors (or, with ``more_smooth``, Gumbel-softmax mixtures of them); the tokenizer's
    ``f_hat`` update applies bicubic upsampling and the shared Phi convolutions except at the last scale, whose codes
    also receive the residual diffusion head's continuous part.
    """

    family = "hart"

    def __init__(
        self,
        transformer: HARTTransformer,
        vae: HARTHybridTokenizer,
        top_k: Optional[int],
        top_p: Optional[float],
        more_smooth: bool,
        diffusion_generator=None,
        use_diffusion_head: bool = True,
        sampling: str = "device",
    ):
        self.transformer, self.vae = transformer, vae
        self.sampling = sampling
        self.draw_check = DrawCheck()  # the device draws' multinomial check, read once after the loop
        self.patch_nums = tuple(transformer.config.patch_nums)
        self.num_scales = len(self.patch_nums)
        self.scale_schedule = [(1, pn, pn) for pn in self.patch_nums]
        self.num_layers = len(transformer.blocks)
        self.top_k, self.top_p, self.more_smooth = top_k, top_p, more_smooth
        self.diffusion_generator, self.use_diffusion_head = diffusion_generator, use_diffusion_head
        self.final_hw = (self.patch_nums[-1], self.patch_nums[-1])
        T = self.num_start_tokens = transformer.config.context_tokens
        self._level_offsets = [0] + [
            T + sum(pn * pn for pn in self.patch_nums[1:k]) for k in range(1, self.num_scales)
        ]
        self._level_embeddings: Optional[torch.Tensor] = None
        self._level_offsets_S: Optional[torch.Tensor] = None
        # RoPE tables of every token of the schedule, per condition rows (built once per call, sliced per pass)
        self._rope_tables: Dict[Tuple, torch.Tensor] = {}
        lengths = [T] + [pn * pn for pn in self.patch_nums[1:]]
        self._rope_offsets = [sum(lengths[:i]) for i in range(len(lengths) + 1)]

    def _top_k(self, scale_index: int) -> int:
        return hart_default_top_k(scale_index) if self.top_k is None else self.top_k

    def _ratio(self, scale_index: int) -> float:
        # the official loop reuses the previous scale's ratio at the last (MaskGIT) scale
        n = self.num_scales - 1
        return min(scale_index, n - 1) / n if n > 0 else 0.0

    def _levels(self) -> torch.Tensor:
        if self._level_embeddings is None:  # once per call, over every position, as the official model
            self._level_embeddings = self.transformer.level_embeddings()
        return self._level_embeddings

    # -- the six steps of the loop (ScaleModelFamily) -------------------------------------------------------------
    def start(self, condition: HARTCondition) -> torch.Tensor:
        return self.transformer.embed_start(condition, self._levels()[: self.transformer.config.context_tokens])

    def embed(self, f_hat, scale_indices, condition: HARTCondition, scale_index_L):
        later = [si for si in scale_indices if si != 0]
        x_BLC = (
            self.embed_inputs(concat_scale_inputs([self.next_inputs(f_hat, si) for si in later]), scale_index_L)
            if later
            else None
        )
        return x_BLC, self.rope_cos_sin(scale_indices, condition)

    # Copied from diffusers_var_accel.pipelines.infinity.pipeline_infinity.InfinityScaleFamily.run_blocks
    def run_blocks(self, hidden_RLC, condition, context: VARForwardContext):
        return self.transformer(hidden_RLC, condition, context)

    def predict(
        self,
        hidden_RLC,
        condition: HARTCondition,
        scale_index,
        *,
        batch_size,
        guidance,
        temperature,
        generator,
        residual_tokens=None,
        tokens=None,
    ) -> ScalePrediction:
        """Guidance with HART's weight ``t = guidance`` (0: none), top-k / top-p sampling, then the codes
        (:meth:`tokens_to_codes`)."""
        logits, raw = self.guided_logits(hidden_RLC, condition, scale_index, guidance, temperature, batch_size)
        if tokens is None:
            tokens = sample_categorical(
                mask_top_k_top_p(logits, self._top_k(scale_index), self.top_p),
                generator,
                self.sampling,
                self.draw_check,
                scale_index,
            )
        codes = self.tokens_to_codes(tokens, scale_index, logits, hidden_RLC, guidance, generator, residual_tokens)
        return ScalePrediction(tokens, codes, raw)

    def add_codes(self, f_hat, codes, scale_index):
        return self.vae.add_scale_codes(f_hat, codes, scale_index, self.num_scales, self.final_hw)

    # Copied from diffusers_var_accel.pipelines.infinity.pipeline_infinity.InfinityScaleFamily.select_rows with Infinity->HART
    def select_rows(self, condition: HARTCondition, rows: slice) -> HARTCondition:
        return condition.select_rows(rows)

    # -- HART's own parts of those steps --------------------------------------------------------------------------
    def embed_inputs(self, inputs_BLd: torch.Tensor, scale_index_L: torch.Tensor) -> torch.Tensor:
        """Embedded tokens of later scales: ``word_embed`` of their latent inputs plus their level embeddings."""
        # rows of the level table: the tokens of scale k (k >= 1) start at T + sum_{0<j<k} pn_j^2. Tensor ops only
        # (no host sync): a token's rank within its scale is its index minus that of its scale's first token.
        table = self._levels()
        scale_index_L = scale_index_L.to(table.device)
        if self._level_offsets_S is None:  # once per call, filled on the device (no upload of host data)
            self._level_offsets_S = torch.cat(
                [torch.full((1,), v, dtype=torch.long, device=table.device) for v in self._level_offsets]
            )
        offsets = self._level_offsets_S
        first = torch.searchsorted(scale_index_L, scale_index_L)
        rows = offsets[scale_index_L] + torch.arange(scale_index_L.shape[0], device=table.device) - first
        levels = table[rows]
        return self.transformer.embed_scale_inputs(
            inputs_BLd.to(compute_dtype(self.transformer.word_embed)), scale_index_L, levels
        )

    def rope_cos_sin(self, scale_indices, condition: HARTCondition):
        """The RoPE tables ``(2, R, 1, L, c)`` of every token of ``scale_indices`` for the rows of ``condition``."""
        # The rows of a condition are fixed for the call (all rows, or the conditional half under CFG halving): the
        # table of every scale is built once per row set and each pass takes its slice (tables are element-wise).
        positions, offsets = condition.position_ids_RT, condition.rope_offset_R
        key = (
            positions.data_ptr(),
            tuple(positions.shape),
            positions.stride(),
            offsets.data_ptr(),
            tuple(offsets.shape),
            offsets.stride(),
        )
        if key not in self._rope_tables:
            tables = [self.transformer.context_rope(positions)]
            tables += [self.transformer.image_rope(pn, offsets) for pn in self.patch_nums[1:]]
            self._rope_tables[key] = torch.cat(tables, dim=3)
        return schedule_slice(self._rope_tables[key], self._rope_offsets, scale_indices, dim=3)

    def guided_logits(self, hidden_RLC, condition: HARTCondition, scale_index, guidance, temperature, batch_size):
        """``(logits to sample from, raw head output)``: ``(1 + t) cond - t uncond`` with ``t = guidance`` (0: the head
        runs on the conditional rows only), then the temperature."""
        B, t = batch_size, guidance
        if t != 0:
            raw = self.transformer.head_logits(hidden_RLC, condition.head_cond_RC)
            guided = (1 + t) * raw[:B] - t * raw[B:]
        else:
            raw = self.transformer.head_logits(hidden_RLC[:B], condition.head_cond_RC[:B])
            guided = raw
        return (guided if temperature == 1 else guided / temperature), raw

    def tokens_to_codes(self, tokens, scale_index, logits_BLV, hidden_RLC, guidance, generator, residual_tokens=None):
        """The codes ``(B, d, side, side)`` of a scale's tokens: codebook vectors (Gumbel-softmax mixtures of them with
        ``more_smooth``, from the logits sampled from) and, at the last scale, the residual diffusion head's
        continuous part, conditioned on the hidden states of every row, only where the plan keeps a residual."""
        side = self.patch_nums[scale_index]
        B = tokens.shape[0]
        codebook = self.vae.quantize.embedding.weight
        hard_BLd = codebook[tokens]
        codes_BLd = hard_BLd
        if self.more_smooth:
            ratio = self._ratio(scale_index)
            masked = mask_top_k_top_p(logits_BLV, self._top_k(scale_index), self.top_p)
            tau = max(0.27 * (1 - ratio * 0.95), 0.005)
            codes_BLd = gumbel_soft_weights(masked.mul(1 + ratio), tau, generator) @ codebook.float().unsqueeze(0)
        if scale_index == self.num_scales - 1 and self.use_diffusion_head:
            codes_BLd = codes_BLd + on_computed_tokens(
                lambda hidden, hard: self.diffusion_residual(hidden, hard, guidance, B),
                residual_tokens,
                hidden_RLC,
                hard_BLd,
                codes_BLd,
            )
        return codes_BLd.transpose(1, 2).reshape(B, -1, side, side)

    def next_inputs(self, f_hat, scale_index):
        """The latent input ``(B, L, d)`` of ``scale_index`` interpolated from ``f_hat``."""
        side = self.patch_nums[scale_index]
        return self.vae.next_scale_input(f_hat, (side, side))

    def diffusion_residual(
        self, hidden_RLC: torch.Tensor, hard_codes_BLd: torch.Tensor, guidance: float, batch_size: int
    ) -> torch.Tensor:
        """The diffusion head's continuous residual ``(B, L, Cv)`` of the last scale (CFG rows when present).

        With a list of generators each image draws its own noise, so an image does not depend on its batch.
        """
        B, L, _ = hard_codes_BLd.shape
        z_RLC = self.transformer.diffusion_condition(hidden_RLC, hard_codes_BLd)
        head = self.transformer.diffusion_head
        if isinstance(self.diffusion_generator, (list, tuple)):
            rows = z_RLC.shape[0] // B
            parts = []
            for b in range(B):
                z_b = z_RLC[b::B] if rows > 1 else z_RLC[b : b + 1]  # [cond_b, uncond_b]
                parts.append(self._sample_head(head, z_b, guidance, self.diffusion_generator[b], 1, L))
            return torch.cat(parts)
        return self._sample_head(head, z_RLC, guidance, self.diffusion_generator, B, L)

    @staticmethod
    def _sample_head(head, z_RLC, guidance, generator, B, L):
        z = z_RLC.reshape(z_RLC.shape[0] * L, -1)
        if z_RLC.shape[0] == B:
            # No unconditional rows ran (guidance off, or halved by a scheduler). The official code always runs
            # the CFG layout (with t = 0 when guidance is off); the same draws and eps = eps_cond reproduce it.
            return head.sample(z, guidance=None, generator=generator).reshape(B, L, -1)
        return head.sample(z, guidance=guidance, generator=generator).reshape(B, L, -1)


class HARTTextInputs(NamedTuple):
    """A call's text inputs as given to :meth:`HARTPipeline.__call__` (checked together by ``check_inputs``)."""

    prompt: Union[str, List[str], None] = None
    negative_prompt: Union[str, List[str], None] = None
    prompt_embeds: Optional[torch.Tensor] = None
    negative_prompt_embeds: Optional[torch.Tensor] = None
    prompt_position_ids: Optional[torch.Tensor] = None
    negative_prompt_position_ids: Optional[torch.Tensor] = None


class HARTSampling(NamedTuple):
    """A call's sampling arguments as given to :meth:`HARTPipeline.__call__` (checked by ``check_inputs``, compared
    with a calibration's)."""

    guidance_scale: float
    cfg_list: Optional[Sequence[float]]
    top_k: int
    top_p: Optional[float]
    more_smooth: bool


class HARTPipeline(DiffusionPipeline, NextScalePipelineMixin, VARAccelerationMixin, VARLoraLoaderMixin):
    r"""Text-to-image generation with HART (arXiv:2410.10812).

    Args:
        transformer ([`HARTTransformer`]): the next-scale transformer with its discrete and diffusion heads.
        vae ([`HARTHybridTokenizer`]): the hybrid tokenizer; its codebook embeds tokens and its decoder makes pixels.
        text_encoder ([`~transformers.Qwen2Model`] or `None`): Qwen2 (1.5B for the real model).
        tokenizer ([`~transformers.PreTrainedTokenizerBase`] or `None`): its tokenizer.
        acceleration ([`VARAccelScheduler`], *optional*): an acceleration scheduler used by every call.
        max_sequence_length (`int`, *optional*): the text context length T of `encode_prompt` (stored in the
            pipeline's configuration, `model_index.json`); it must equal the transformer's `context_tokens`, which is
            the default; in a pipeline without a transformer the default is the official 300, capped by the
            tokenizer's `model_max_length`.
        preset_model (`str`, *optional*): the model whose packaged presets `enable_<method>()` and method names use
            (stored in `model_index.json`, so a saved copy keeps it): the embedded model's folder sets
            `"embedded"`; `None` (the default) uses the family's. It must have presets for this family.

    HART generates at one resolution (the last patch number times the tokenizer's downsampling: 1024 for 0.7B).
    The text encoder and tokenizer are components every prompt needs, as in diffusers' text-to-image pipelines: pass
    ``text_encoder=None, tokenizer=None`` for a pipeline that runs from ``prompt_embeds`` only (``from_pretrained``
    of a folder saved without them keeps them ``None`` by itself). ``acceleration`` is the one optional component.
    """

    model_family = "hart"
    # The tokenizer's codebook and residual convolutions run at every scale, between transformer passes: as a step of
    # the offload sequence it would swap the transformer out and back at each scale, so model offload keeps it on the
    # accelerator (it is small next to the transformer and the text encoder).
    model_cpu_offload_seq = "text_encoder->transformer"
    _exclude_from_cpu_offload = ["vae"]
    _optional_components = ["acceleration"]
    sampling_arguments = ("guidance_scale", "top_k", "top_p", "more_smooth")
    _callback_tensor_inputs = ["latents", "tokens", "logits", "prompt_embeds"]

    def __init__(
        self,
        transformer: HARTTransformer,
        vae: HARTHybridTokenizer,
        text_encoder,
        tokenizer,
        acceleration: Optional[VARAccelScheduler] = None,
        max_sequence_length: Optional[int] = None,
        preset_model: Optional[str] = None,
    ):
        super().__init__()
        check_max_sequence_length(max_sequence_length)
        check_preset_model(preset_model, self.model_family)
        if (
            max_sequence_length is not None
            and transformer is not None
            and max_sequence_length != transformer.config.context_tokens
        ):
            raise ValueError(
                f"max_sequence_length={max_sequence_length}: HART's text context is exactly the "
                f"transformer's context_tokens ({transformer.config.context_tokens}); pass that or None"
            )
        if acceleration is not None:
            acceleration.check_model_family(self.model_family)
        self.register_modules(
            transformer=transformer, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, acceleration=acceleration
        )
        self.register_to_config(max_sequence_length=max_sequence_length, preset_model=preset_model)
        # vae may be None (a text-encoding-only pipeline: encode_prompt); the factor only matters for resizing, which is off
        self.image_processor = VaeImageProcessor(
            vae_scale_factor=self.vae_scale_factor if vae is not None else 32, do_resize=False
        )
        self._interrupt = False

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        """``DiffusionPipeline.from_pretrained``, as strict as loading the official checkpoints; ``dtype`` (or its older
        name ``torch_dtype``) may be a ``torch.dtype`` or its name (``"bfloat16"``). A folder or repo with our Hub shim
        (``hub.write_hub_shim``) loads without ``trust_remote_code``.

        Raises:
            FileNotFoundError: a component folder is missing.
            ValueError: ``model_index.json`` names another or a non-existent class, a weights file is empty or
                truncated, or a component's weights do not match its ``config.json`` (the files and keys are named).
        """
        from ...hub import holds_own_shim

        path, kwargs = prepare_pipeline_loading(cls, pretrained_model_name_or_path, kwargs)
        if not kwargs.get("trust_remote_code") and holds_own_shim(path, cls.__name__, **kwargs):
            kwargs["trust_remote_code"] = True  # the only code is our one-line import of this class, checked above
        with no_nested_progress_bars():
            pipe = super().from_pretrained(path, **kwargs)
        check_loaded_pipeline(pipe, path, passed=list(kwargs))
        return pipe

    # Copied from diffusers_var_accel.pipelines.infinity.pipeline_infinity.InfinityPipeline.save_pretrained
    def save_pretrained(self, save_directory, *args, **kwargs) -> None:
        """``DiffusionPipeline.save_pretrained``, all or nothing: the whole folder is written beside ``save_directory``
        and swapped in by two renames, so a process killed while saving leaves the earlier pipeline or this one, never a
        mix of both and never neither (:func:`~diffusers_var_accel.pipelines.pipeline_loading.save_pipeline_folder`)."""
        save_pipeline_folder(self, save_directory, args, kwargs)

    @property
    def vae_scale_factor(self) -> int:
        return 2 ** (len(self.vae.config.ch_mult) - 1)

    @property
    def default_size(self) -> int:
        """The one image side this model generates."""
        return self.transformer.config.patch_nums[-1] * self.vae_scale_factor

    def guided_call(self, guidance_scale: Optional[float] = None) -> bool:
        """Whether a call with this guidance weight (`None`: the call's default) runs the unconditional CFG rows
        (HART's weight ``t``: 0 = none)."""
        if guidance_scale is None:
            guidance_scale = self.call_default("guidance_scale")
        return float(guidance_scale) != 0

    def _kv_cache_layout(self, height: Optional[int], width: Optional[int]):
        """HART's one schedule and its start tokens (the text context), for :meth:`kv_cache_bytes`."""
        side = self.default_size
        if (height or side, width or side) != (side, side):
            raise ValueError(
                f"height x width = {height}x{width} is not supported: this model makes {side}x{side} images only"
            )
        schedule = tuple((1, int(pn), int(pn)) for pn in self.transformer.config.patch_nums)
        return schedule, int(self.transformer.config.context_tokens)

    # Copied from diffusers_var_accel.pipelines.infinity.pipeline_infinity.InfinityPipeline.enable_group_offload
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
        """The text context length T every prompt is padded or truncated to: the transformer's ``context_tokens``;
        without a transformer the pipeline's configured ``max_sequence_length``, else the official 300 capped by the
        tokenizer's ``model_max_length``."""
        if self.transformer is not None:
            return int(self.transformer.config.context_tokens)
        limit = getattr(self.config, "max_sequence_length", None)
        if limit is not None:
            return int(limit)
        tokenizer_limit = getattr(self.tokenizer, "model_max_length", None) or HART_CONTEXT_TOKENS
        return int(min(HART_CONTEXT_TOKENS, tokenizer_limit))

    def encode_prompt(
        self,
        prompt: Union[str, List[str]],
        device: Optional[torch.device] = None,
        num_images_per_prompt: int = 1,
        use_system_prompt: bool = True,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Qwen2 features of the prompts as the official ``encode_prompts``: ``(prompt_embeds (B, T, D),
        prompt_position_ids (B, T))``, the arguments of the same names of ``__call__`` (for a negative prompt, pass the
        outputs of its encoding as ``negative_prompt_embeds`` / ``negative_prompt_position_ids``). Uses the text
        encoder and the tokenizer; the VAE and the transformer may be absent.

        Each prompt is padded/truncated to T = :meth:`text_token_limit` context tokens; with ``use_system_prompt`` the
        official instruction is prepended (all visible) and only the prompt's own slots are kept. Position ids are
        ``cumsum(mask) - 1`` (right padding repeats the last valid position).
        """
        if self.text_encoder is None or self.tokenizer is None:
            raise ValueError(
                "this pipeline has no text_encoder/tokenizer: pass prompt_embeds and prompt_position_ids instead of prompt"
            )
        check_prompt_argument("prompt", prompt, required=True)
        check_positive_int("num_images_per_prompt", num_images_per_prompt)
        device = device or self._execution_device
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        T = self.text_token_limit()
        warn_if_truncated(self.tokenizer, prompts, T, "HART's text context")
        pad_id = self.tokenizer.pad_token_id
        if pad_id is None:
            raise ValueError("the tokenizer has no pad token; HART pads every prompt to the context length")
        ids = torch.stack(
            [
                self.tokenizer(p, return_tensors="pt", padding="max_length", max_length=T, truncation=True).input_ids[
                    0
                ]
                for p in prompts
            ]
        ).to(device)
        mask = ids != pad_id
        position_ids = mask.long().cumsum(dim=1) - 1
        if use_system_prompt:
            system = (
                self.tokenizer(
                    HART_LLM_SYSTEM_PROMPT, return_tensors="pt", padding="longest", max_length=T, truncation=True
                )
                .input_ids.to(device)
                .repeat(len(prompts), 1)
            )
            full_ids = torch.cat((system, ids), dim=1)
            full_mask = torch.cat((torch.ones_like(system, dtype=torch.bool), mask), dim=1)
            hidden = self.text_encoder(
                full_ids, attention_mask=full_mask.long(), output_hidden_states=True
            ).hidden_states[-1]
            hidden = hidden[:, system.shape[1] :]
        else:
            hidden = self.text_encoder(ids, attention_mask=mask.long(), output_hidden_states=True).hidden_states[-1]
        prompt_embeds = hidden.float().repeat_interleave(num_images_per_prompt, dim=0)
        prompt_position_ids = position_ids.repeat_interleave(num_images_per_prompt, dim=0)
        return prompt_embeds, prompt_position_ids

    # 2. checks ---------------------------------------------------------------------------------------------------
    def check_inputs(
        self,
        text: "HARTTextInputs",
        sampling: "HARTSampling",
        height: int,
        width: int,
        num_images_per_prompt=1,
        generator=None,
        diffusion_generator=None,
        output_type="pil",
        callback_on_step_end_tensor_inputs=None,
    ):
        """Raise a ``ValueError`` (``InputTypeError``, also a ``TypeError``, for a wrong type) naming the first bad
        argument, its value and what is allowed."""
        prompt, negative_prompt, prompt_embeds, negative_prompt_embeds = text[:4]
        prompt_position_ids, negative_prompt_position_ids = text[4:]
        guidance_scale, cfg_list, top_k, top_p, _ = sampling
        size = self.default_size
        if (height, width) != (size, size):
            raise ValueError(
                f"HART generates {size}x{size} images only (last patch number {self.transformer.config.patch_nums[-1]} "
                f"x tokenizer downsampling {self.vae_scale_factor}); got height={height}, width={width}"
            )
        if (prompt is None) == (prompt_embeds is None):
            raise ValueError("pass exactly one of prompt or prompt_embeds")
        check_prompt_argument("prompt", prompt)
        check_prompt_argument("negative_prompt", negative_prompt)
        T, D = self.transformer.config.context_tokens, self.transformer.config.context_dim
        check_text_embeds("prompt_embeds", prompt_embeds, D, tokens=T)
        check_text_embeds("negative_prompt_embeds", negative_prompt_embeds, D, tokens=T)
        for name, ids in (
            ("prompt_position_ids", prompt_position_ids),
            ("negative_prompt_position_ids", negative_prompt_position_ids),
        ):
            if ids is not None and (not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.is_complex()):
                raise InputTypeError(
                    f"{name} must be an integer tensor (batch, {T}), got "
                    f"{ids.dtype if isinstance(ids, torch.Tensor) else type(ids).__name__}"
                )
        if (
            prompt_position_ids is not None
            and prompt_embeds is not None
            and tuple(prompt_position_ids.shape) != tuple(prompt_embeds.shape[:2])
        ):
            raise ValueError(
                f"prompt_position_ids shape {tuple(prompt_position_ids.shape)} != prompt_embeds (batch, tokens) {tuple(prompt_embeds.shape[:2])}"
            )
        if prompt_position_ids is not None and prompt_embeds is None:
            raise ValueError(
                "prompt_position_ids go with prompt_embeds; with a prompt they come from its tokenization"
            )
        if negative_prompt_position_ids is not None:
            if negative_prompt_embeds is None:
                raise ValueError("negative_prompt_position_ids go with negative_prompt_embeds")
            if negative_prompt_position_ids.shape != negative_prompt_embeds.shape[:2]:
                raise ValueError(
                    f"negative_prompt_position_ids shape {tuple(negative_prompt_position_ids.shape)} != "
                    f"negative_prompt_embeds (batch, tokens) {tuple(negative_prompt_embeds.shape[:2])}"
                )
        if negative_prompt is not None and negative_prompt_embeds is not None:
            raise ValueError("pass at most one of negative_prompt and negative_prompt_embeds")
        check_positive_int("num_images_per_prompt", num_images_per_prompt)
        check_generator("generator", generator)
        check_generator("diffusion_generator", diffusion_generator)
        check_output_type(output_type)
        num_scales = len(self.transformer.config.patch_nums)
        if cfg_list is not None:
            check_per_scale(
                "cfg_list", cfg_list, num_scales, 0, rule=" (guidance weight t)", schedule_text="the model"
            )
        check_real("guidance_scale", guidance_scale, 0, rule=" (HART's weight t: (1 + t) cond - t uncond)")
        if top_p is not None:
            check_real("top_p", top_p, rule=" in [0, 1] (0 disables it)")
            if not (0 <= top_p <= 1):
                raise ValueError(f"top_p must be in [0, 1] (0 disables it), got {top_p}")
        if top_k is not None:
            check_real("top_k", top_k, rule=" (an integer >= 0; 0 disables it; None = the official 600/300 schedule)")
            if int(top_k) != top_k or top_k < 0:
                raise ValueError(
                    f"top_k must be an integer >= 0 (0 disables it; None = the official 600/300 schedule), got {top_k}"
                )
        bad = [k for k in (callback_on_step_end_tensor_inputs or []) if k not in self._callback_tensor_inputs]
        if bad:
            raise ValueError(f"callback_on_step_end_tensor_inputs {bad} are not in {self._callback_tensor_inputs}")

    @staticmethod
    def guidance_schedule(guidance_scale: float, num_scales: int) -> List[float]:
        """HART's per-scale guidance weight: ``t = cfg * si / (n - 1)``, 0 at the first scale, and at the last scale
        the previous scale's value (the official loop reuses its ratio there)."""
        n = num_scales - 1
        if n <= 0:
            return [0.0] * num_scales
        return [guidance_scale * (min(si, n - 1) / n) for si in range(num_scales)]

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
        guidance_scale: float = 4.5,
        cfg_list: Optional[Sequence[float]] = None,
        top_k: Optional[int] = None,
        top_p: Optional[float] = 0.0,
        more_smooth: bool = True,
        use_diffusion_head: bool = True,
        num_images_per_prompt: int = 1,
        generator: Union[torch.Generator, List[torch.Generator], None] = None,
        diffusion_generator: Union[torch.Generator, List[torch.Generator], None] = None,
        prompt_embeds: Optional[torch.Tensor] = None,
        prompt_position_ids: Optional[torch.Tensor] = None,
        negative_prompt_embeds: Optional[torch.Tensor] = None,
        negative_prompt_position_ids: Optional[torch.Tensor] = None,
        use_system_prompt: bool = True,
        teacher_tokens: Optional[Sequence[torch.Tensor]] = None,
        acceleration: Optional[VARAccelScheduler] = None,
        output_type: str = "pil",
        return_dict: bool = True,
        callback_on_step_end: Optional[
            Callable[["HARTPipeline", int, Tuple[int, ...], Dict[str, Any]], Dict[str, Any]]
        ] = None,
        callback_on_step_end_tensor_inputs: Sequence[str] = ("latents",),
    ):
        r"""Generate images from text.

        Args:
            prompt (`str` or `List[str]`, *optional*): the prompt(s); or pass `prompt_embeds`. `""` is encoded like
                any text, as diffusers' pipelines do (the command line refuses an empty prompt).
            negative_prompt (`str` or `List[str]`, *optional*): its Qwen2 features replace the official all-zero
                unconditional context in the CFG rows.
            height (`int`, *optional*): must be the model's one size (`default_size`, 1024 for HART-0.7B).
            width (`int`, *optional*): likewise.
            guidance_scale (`float`, *optional*, defaults to 4.5): HART's CFG weight ``cfg``; scale ``si`` uses
                ``t = cfg * si / (n - 1)`` (linear ramp from 0) and ``(1 + t) cond - t uncond``. 0 disables CFG.
            cfg_list (`List[float]`, *optional*): the weight ``t`` of every scale, overriding the ramp.
            top_k (`int`, *optional*): top-k of every scale (1 = greedy, 0 = off); `None` is the official 600 / 300.
            top_p (`float`, *optional*, defaults to 0.0): nucleus threshold (0 = off, as the official scripts).
            more_smooth (`bool`, *optional*, defaults to `True`): embed each token as a Gumbel-softmax mixture of
                codebook vectors (the official scripts' default) instead of its codebook vector.
            use_diffusion_head (`bool`, *optional*, defaults to `True`): add the residual diffusion head's output at
                the last scale (`False` = the discrete-only image, official ``final_stage != 0``).
            num_images_per_prompt (`int`, *optional*, defaults to 1): images per prompt.
            generator (`torch.Generator` or `List[torch.Generator]`, *optional*): token sampling (one draw per scale
                for the batch, or one generator per image).
            diffusion_generator (`torch.Generator` or `List`, *optional*): the diffusion head's noise. By default a
                generator seeded with `generator`'s seed (the official scripts seed both with one seed); the global
                RNG when `generator` is None.
            prompt_embeds (`torch.Tensor`, *optional*): Qwen2 features (B, T, D) bypassing the text encoder, with
                `prompt_position_ids` (B, T) (``cumsum(mask) - 1``; ``arange(T)`` when omitted).
            negative_prompt_embeds (`torch.Tensor`, *optional*): likewise, for the unconditional rows.
            negative_prompt_position_ids (`torch.Tensor`, *optional*): the position ids of `negative_prompt_embeds`.
            use_system_prompt (`bool`, *optional*, defaults to `True`): prepend the official instruction to prompts.
            teacher_tokens (`List[torch.Tensor]`, *optional*): token ids (B, L) used instead of sampling at the first
                `len(teacher_tokens)` scales.
            acceleration (`VARAccelScheduler` or `str`, *optional*): accelerate this call only (overrides the attached
                one); a method name or names joined with ``"+"`` as in ``enable_acceleration``.
            output_type (`str`, *optional*, defaults to `"pil"`): `"pil"`, `"np"`, `"pt"` or `"latent"` (f_hat).
            return_dict (`bool`, *optional*, defaults to `True`): return an `ImagePipelineOutput` or a tuple.
            callback_on_step_end (`Callable`, *optional*): called after each scale as
                `callback(pipe, scale_index, scale, callback_kwargs)`; may return a new `latents`, and may set
                `pipe._guidance_scale` (the weight `cfg` of the ramp, or one weight `t` per scale as `cfg_list`)
                for the scales that follow.
            callback_on_step_end_tensor_inputs (`List[str]`, *optional*): names from `_callback_tensor_inputs`.

        Examples:

        Returns:
            [`~diffusers.pipelines.pipeline_utils.ImagePipelineOutput`] or `tuple`: the images in its `images` field,
                or the tuple `(images,)` when `return_dict` is `False`.
        """
        size = self.default_size
        height, width = resolve_size(height, width, (size, size))
        sampling = HARTSampling(guidance_scale, cfg_list, top_k, top_p, more_smooth)
        text = HARTTextInputs(
            prompt,
            negative_prompt,
            prompt_embeds,
            negative_prompt_embeds,
            prompt_position_ids,
            negative_prompt_position_ids,
        )
        self.check_inputs(
            text,
            sampling,
            height,
            width,
            num_images_per_prompt,
            generator,
            diffusion_generator,
            output_type,
            callback_on_step_end_tensor_inputs,
        )
        patch_nums = tuple(self.transformer.config.patch_nums)
        num_scales = len(patch_nums)
        weights = (
            [float(t) for t in cfg_list]
            if cfg_list is not None
            else self.guidance_schedule(float(guidance_scale), num_scales)
        )
        self._guidance_scale = weights if cfg_list is not None else float(guidance_scale)
        self._num_timesteps, self._interrupt = num_scales, False
        scheduler = self._acceleration_for_call(acceleration)
        self._warn_if_sampling_differs_from_calibration(scheduler, sampling._asdict())
        device = self._execution_device

        # 1. Text conditioning: conditional rows, then unconditional rows when any scale is guided
        if prompt_embeds is None:
            prompt_embeds, prompt_position_ids = self.encode_prompt(
                prompt, device, num_images_per_prompt, use_system_prompt
            )
        else:
            prompt_embeds, prompt_position_ids = self._given_embeds(
                prompt_embeds, prompt_position_ids, device, num_images_per_prompt
            )
        batch_size = prompt_embeds.shape[0]
        for name, gen in (("generator", generator), ("diffusion_generator", diffusion_generator)):
            check_generator_count(name, gen, batch_size)
        text, positions = prompt_embeds, prompt_position_ids
        warn_unused_negative(
            negative_prompt, negative_prompt_embeds, all(t == 0 for t in weights), "every guidance weight is 0"
        )
        if any(t != 0 for t in weights):
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
                neg, neg_pos = self.encode_prompt(negatives, device, num_images_per_prompt, use_system_prompt)
            elif negative_prompt_embeds is not None:
                neg, neg_pos = self._given_embeds(
                    negative_prompt_embeds, negative_prompt_position_ids, device, num_images_per_prompt
                )
                if neg.shape[0] != batch_size:
                    raise ValueError(
                        f"negative_prompt_embeds has {neg.shape[0] // num_images_per_prompt} rows for {batch_size // num_images_per_prompt} prompts"
                    )
            else:
                neg, neg_pos = self.transformer.null_context(batch_size, device=device)
            text, positions = torch.cat((text, neg.to(text.dtype))), torch.cat((positions, neg_pos))
        dtype = self.transformer.dtype
        autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype in (torch.float16, torch.bfloat16))
        with autocast:
            condition = self.transformer.encode_condition(text, positions)

        # 2. The next-scale loop
        if diffusion_generator is None and generator is not None:
            diffusion_generator = (
                [_reseeded(g) for g in generator] if isinstance(generator, list) else _reseeded(generator)
            )
        family = HARTScaleFamily(
            self.transformer,
            self.vae,
            top_k,
            top_p,
            more_smooth,
            diffusion_generator,
            use_diffusion_head,
            self.sampling,
        )
        if teacher_tokens is not None:
            vocab = int(self.vae.quantize.embedding.weight.shape[0])
            check_teacher_tokens(
                teacher_tokens,
                [(batch_size, pn * pn) for pn in patch_nums],
                [f"({batch_size}, {pn}, {pn})" for pn in patch_nums],
                integer_range=(0, vocab - 1),
            )
            teacher_tokens = [t.to(device).reshape(batch_size, -1).long() for t in teacher_tokens]
        progress = self.progress_bar(total=num_scales)

        on_scale_end = self._scale_callback(
            callback_on_step_end, callback_on_step_end_tensor_inputs, family.scale_schedule, prompt_embeds, progress
        )

        with progress, autocast:
            # the loop takes HART's guidance weight t per scale; a callback may change it between scales
            live_guidance = LiveGuidance(
                self, num_scales, self.guidance_schedule, no_guidance=get_model_family(self.model_family).no_guidance
            )
            state = run_next_scale_loop(
                family,
                condition,
                family.scale_schedule,
                batch_size,
                live_guidance,
                [1.0] * num_scales,
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

        # 3. Decode
        return self._decode_output(
            latents,
            output_type,
            return_dict,
            per_image=isinstance(generator, (list, tuple)),
            draw_check=family.draw_check,
        )

    def _given_embeds(self, embeds, position_ids, device, num_images_per_prompt):
        embeds = embeds.to(device).float().repeat_interleave(num_images_per_prompt, dim=0)
        if position_ids is None:
            position_ids = torch.arange(embeds.shape[1], device=device).expand(
                embeds.shape[0] // num_images_per_prompt, -1
            )
        return embeds, position_ids.to(device).long().repeat_interleave(num_images_per_prompt, dim=0)


def _reseeded(generator: torch.Generator) -> torch.Generator:
    """A fresh generator on the same device seeded with ``generator``'s seed (official: one seed for both streams)."""
    return torch.Generator(device=generator.device).manual_seed(generator.initial_seed())


# a folder whose model_index.json names HARTPipeline loads through DiffusionPipeline.from_pretrained as soon as this
# module is imported, whichever way it was reached
from ..diffusers_registration import register_pipelines_with_diffusers  # noqa: E402

register_pipelines_with_diffusers(HARTPipeline)
