"""A toy third model family, for tests only: everything a model family plugs into the library, in one file.

"ToyVAR" is a small next-scale model of its own: bytes of the prompt pooled into a condition that forms the start
token (as VAR's class token), blocks of llama attention (the package's shared attention module and processor) and a
GELU MLP, 1D RoPE over each token's position in the schedule, a categorical head with classifier-free guidance
``g c + (1 - g) u`` (no guidance at ``g = 1``), and a codebook tokenizer whose ``f_hat`` is the bicubic-upsampled sum
of the scales' codes. It differs from Infinity and HART where a family may differ: its own condition, embedding,
positions, head, codes, tokenizer and pipeline.

What plugging it in takes (and all it takes): the four classes below (:class:`ToyTransformer`,
:class:`ToyTokenizer`, :class:`ToyScaleFamily`, :class:`ToyPipeline`), a tiny builder and one
``register_model_family`` call (:func:`registered`). ``tests/library/test_family_conformance.py`` runs the family
conformance suite, every method and a composition on it; its lab side (the FLOP breakdown, ``toy_family_lab.py``) is
counted by ``tests/lab/test_lab_families.py``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.image_processor import VaeImageProcessor
from diffusers.models.modeling_utils import ModelMixin
from diffusers.pipelines.pipeline_utils import DiffusionPipeline
from torch import nn

from diffusers_var_accel.families import MODEL_FAMILIES, ModelFamily, register_model_family, unregister_model_family
from diffusers_var_accel.models.attention_processor import VARAttentionMixin
from diffusers_var_accel.models.transformer_hart import HARTAttention
from diffusers_var_accel.next_scale import (
    ScaleModelFamily,
    ScalePrediction,
    VARForwardContext,
    execute_blocks,
    run_next_scale_loop,
    run_sublayer,
)
from diffusers_var_accel.next_scale.state import concat_scale_inputs, schedule_slice
from diffusers_var_accel.pipelines.acceleration_mixin import VARAccelerationMixin
from diffusers_var_accel.pipelines.guidance import LiveGuidance
from diffusers_var_accel.pipelines.pipeline_common import NextScalePipelineMixin
from diffusers_var_accel.pipelines.sampling import mask_top_k_top_p, sample_categorical

TOY = "toyvar"
#: Text bytes per prompt (longer prompts are cut, shorter ones padded with 0).
TEXT_BYTES = 32


@dataclass
class ToyCondition:
    """The condition of every row: ``cond_RC`` (conditional rows first, then the unconditional ones)."""

    cond_RC: torch.Tensor

    def select_rows(self, rows: slice) -> "ToyCondition":
        return ToyCondition(self.cond_RC[rows])


class ToyBlock(nn.Module):
    """``x = x + attn(ln(x)); x = x + mlp(ln(x))``, each update through the executor (which adds it to every token
    without routes, and carries a route's selection and fill out when the pass has one)."""

    def __init__(self, embed_dim: int, num_heads: int, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.attn_norm = nn.LayerNorm(embed_dim)
        self.attn = HARTAttention(embed_dim, num_heads, layer_idx)
        self.ffn_norm = nn.LayerNorm(embed_dim)
        self.ffn = nn.Sequential(nn.Linear(embed_dim, 2 * embed_dim), nn.GELU(), nn.Linear(2 * embed_dim, embed_dim))

    def forward(self, x, condition: ToyCondition, context: VARForwardContext):
        x = run_sublayer(
            self.layer_idx, "self_attn", x, lambda x_sub, ctx: self.attn(self.attn_norm(x_sub), ctx), context
        )
        return run_sublayer(self.layer_idx, "ffn", x, lambda x_sub, ctx: self.ffn(self.ffn_norm(x_sub)), context)


class ToyTransformer(ModelMixin, ConfigMixin, VARAttentionMixin):
    """The toy's next-scale transformer (weights only)."""

    @register_to_config
    def __init__(
        self,
        embed_dim: int = 32,
        num_heads: int = 2,
        depth: int = 6,
        vocab_size: int = 16,
        codebook_dim: int = 4,
        patch_nums: Tuple[int, ...] = (1, 2, 3, 4, 5, 6, 8, 10),
        rope_theta: float = 100.0,
    ):
        super().__init__()
        self.text_embed = nn.Embedding(256, embed_dim)
        self.null_cond = nn.Parameter(torch.randn(embed_dim) * 0.02)
        self.pos_start = nn.Parameter(torch.randn(1, 1, embed_dim) * 0.02)
        self.word_embed = nn.Linear(codebook_dim, embed_dim)
        self.level_embed = nn.Embedding(len(patch_nums), embed_dim)
        self.blocks = nn.ModuleList(ToyBlock(embed_dim, num_heads, i) for i in range(depth))
        self.head_norm = nn.LayerNorm(embed_dim)
        self.head = nn.Linear(embed_dim, vocab_size)

    def encode_condition(self, byte_ids_RT: torch.Tensor, unconditional_rows: int = 0) -> ToyCondition:
        """The mean embedding of each prompt's bytes (0 is padding), then ``unconditional_rows`` null rows."""
        weights = (byte_ids_RT != 0).float()
        pooled = (self.text_embed(byte_ids_RT) * weights.unsqueeze(-1)).sum(1) / weights.sum(1, keepdim=True).clamp(
            min=1
        )
        null = self.null_cond.expand(unconditional_rows, -1)
        return ToyCondition(torch.cat((pooled, null)) if unconditional_rows else pooled)

    def rope_cos_sin(self, positions_L: torch.Tensor, rows: int) -> torch.Tensor:
        """Llama 1D RoPE table ``(2, R, 1, L, c)`` of token positions (the same for every row)."""
        head_dim = self.config.embed_dim // self.config.num_heads
        inv_freq = 1.0 / self.config.rope_theta ** (
            torch.arange(0, head_dim, 2, device=positions_L.device).float() / head_dim
        )
        freqs = positions_L.float().unsqueeze(-1) * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return (
            torch.stack((emb.cos(), emb.sin()))
            .view(2, 1, 1, -1, head_dim)
            .expand(2, rows, 1, -1, head_dim)
            .contiguous()
        )

    def forward(
        self, hidden_states_RLC: torch.Tensor, condition: ToyCondition, context: VARForwardContext
    ) -> torch.Tensor:
        return execute_blocks(self.blocks, hidden_states_RLC, condition, context)

    def head_logits(self, hidden_states_RLC: torch.Tensor) -> torch.Tensor:
        return self.head(self.head_norm(hidden_states_RLC.float()))


class ToyTokenizer(ModelMixin, ConfigMixin):
    """A codebook, the ``f_hat`` update (codes upsampled bicubically to the last scale and summed) and a decoder."""

    @register_to_config
    def __init__(self, vocab_size: int = 16, codebook_dim: int = 4, final_side: int = 10, upscale: int = 2):
        super().__init__()
        self.codebook = nn.Embedding(vocab_size, codebook_dim)
        self.decoder = nn.Conv2d(codebook_dim, 3, 3, padding=1)

    def add_scale_codes(self, f_hat: Optional[torch.Tensor], codes_Bdhw: torch.Tensor) -> torch.Tensor:
        side = self.config.final_side
        up = (
            codes_Bdhw
            if codes_Bdhw.shape[-1] == side
            else F.interpolate(codes_Bdhw, size=(side, side), mode="bicubic")
        )
        return up if f_hat is None else f_hat + up

    def next_scale_input(self, f_hat: torch.Tensor, side: int) -> torch.Tensor:
        """``(B, side^2, d)``: ``f_hat`` area-downsampled to the scale."""
        return F.interpolate(f_hat, size=(side, side), mode="area").flatten(2).transpose(1, 2).contiguous()

    def decode(self, f_hat: torch.Tensor) -> torch.Tensor:
        return torch.tanh(F.interpolate(self.decoder(f_hat), scale_factor=self.config.upscale, mode="nearest"))


class ToyScaleFamily(ScaleModelFamily):
    """The toy's six steps of the next-scale loop, for one call."""

    family = TOY
    num_start_tokens = 1

    def __init__(self, transformer: ToyTransformer, vae: ToyTokenizer, top_k: int, sampling: str = "device"):
        self.transformer, self.vae, self.top_k, self.sampling = transformer, vae, top_k, sampling
        self.patch_nums = tuple(transformer.config.patch_nums)
        self.scale_schedule = [(1, pn, pn) for pn in self.patch_nums]
        self.num_layers = len(transformer.blocks)
        lengths = [pn * pn for pn in self.patch_nums]
        self._offsets = [sum(lengths[:i]) for i in range(len(lengths) + 1)]
        self._rope: Dict[Tuple, torch.Tensor] = {}  # per row count, for the call

    def start(self, condition: ToyCondition) -> torch.Tensor:
        return self.transformer.pos_start + condition.cond_RC.unsqueeze(1)

    def embed(self, f_hat, scale_indices, condition: ToyCondition, scale_index_L):
        rows = condition.cond_RC.shape[0]
        if rows not in self._rope:
            positions = torch.arange(self._offsets[-1], device=condition.cond_RC.device)
            self._rope[rows] = self.transformer.rope_cos_sin(positions, rows)
        rope = schedule_slice(self._rope[rows], self._offsets, scale_indices, dim=3)
        later = [si for si in scale_indices if si != 0]
        if not later:
            return None, rope
        inputs_BLd = concat_scale_inputs([self.vae.next_scale_input(f_hat, self.patch_nums[si]) for si in later])
        return self.transformer.word_embed(inputs_BLd) + self.transformer.level_embed(scale_index_L), rope

    def run_blocks(self, hidden_RLC, condition, context):
        return self.transformer(hidden_RLC, condition, context)

    def predict(
        self,
        hidden_RLC,
        condition,
        scale_index,
        *,
        batch_size,
        guidance,
        temperature,
        generator,
        residual_tokens=None,
        tokens=None,
    ) -> ScalePrediction:
        B = batch_size
        if guidance != 1:
            raw = self.transformer.head_logits(hidden_RLC)
            logits = guidance * raw[:B] + (1 - guidance) * raw[B:]
        else:
            raw = logits = self.transformer.head_logits(hidden_RLC[:B])
        logits = logits / temperature
        if tokens is None:
            tokens = sample_categorical(mask_top_k_top_p(logits, self.top_k, None), generator, self.sampling)
        side = self.patch_nums[scale_index]
        codes = self.vae.codebook(tokens).transpose(1, 2).reshape(B, -1, side, side)
        return ScalePrediction(tokens, codes, raw)

    def add_codes(self, f_hat, codes, scale_index):
        return self.vae.add_scale_codes(f_hat, codes)

    def select_rows(self, condition: ToyCondition, rows: slice) -> ToyCondition:
        return condition.select_rows(rows)


class ToyPipeline(DiffusionPipeline, NextScalePipelineMixin, VARAccelerationMixin):
    """Text-to-image generation with ToyVAR."""

    model_family = TOY
    _optional_components = ["acceleration"]
    _callback_tensor_inputs = ["latents", "tokens", "logits", "prompt_embeds"]

    def __init__(self, transformer: ToyTransformer, vae: ToyTokenizer, acceleration=None):
        super().__init__()
        if acceleration is not None:
            acceleration.check_model_family(self.model_family)
        self.register_modules(transformer=transformer, vae=vae, acceleration=acceleration)
        self.image_processor = VaeImageProcessor(vae_scale_factor=vae.config.upscale, do_resize=False)
        self._interrupt = False

    @property
    def default_size(self) -> int:
        return self.transformer.config.patch_nums[-1] * self.vae.config.upscale

    def guided_call(self, guidance_scale: Optional[float] = None) -> bool:
        return float(self.call_default("guidance_scale") if guidance_scale is None else guidance_scale) != 1

    def _kv_cache_layout(self, height, width):
        side = self.default_size
        if (height or side, width or side) != (side, side):
            raise ValueError(
                f"height x width = {height}x{width} is not supported: ToyVAR makes {side}x{side} images only"
            )
        return tuple((1, pn, pn) for pn in self.transformer.config.patch_nums), 1

    def encode_prompt(self, prompt: Union[str, List[str]], device) -> torch.Tensor:
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        ids = torch.zeros(len(prompts), TEXT_BYTES, dtype=torch.long)
        for row, text in enumerate(prompts):
            data = list(text.encode("utf-8")[:TEXT_BYTES])
            ids[row, : len(data)] = torch.tensor(data, dtype=torch.long)
        return ids.to(device)

    @torch.no_grad()
    def __call__(
        self,
        prompt: Union[str, List[str]],
        height: Optional[int] = None,
        width: Optional[int] = None,
        guidance_scale: float = 3.0,
        top_k: int = 4,
        generator=None,
        acceleration=None,
        output_type: str = "pil",
        return_dict: bool = True,
        callback_on_step_end: Optional[Callable] = None,
        callback_on_step_end_tensor_inputs: Sequence[str] = ("latents",),
    ):
        self._kv_cache_layout(height, width)
        schedule = [(1, pn, pn) for pn in self.transformer.config.patch_nums]
        num_scales = len(schedule)
        self._guidance_scale, self._num_timesteps, self._interrupt = float(guidance_scale), num_scales, False
        guidance = LiveGuidance(self, num_scales, lambda g, n: [g] * n, no_guidance=MODEL_FAMILIES[TOY].no_guidance)
        scheduler = self._acceleration_for_call(acceleration)
        device = self._execution_device
        byte_ids = self.encode_prompt(prompt, device)
        batch_size = byte_ids.shape[0]
        guided = any(g != 1 for g in guidance)
        condition = self.transformer.encode_condition(byte_ids, unconditional_rows=batch_size if guided else 0)
        family = ToyScaleFamily(self.transformer, self.vae, top_k, self.sampling)
        progress = self.progress_bar(total=num_scales)
        on_scale_end = self._scale_callback(
            callback_on_step_end, callback_on_step_end_tensor_inputs, schedule, byte_ids, progress
        )
        with progress:
            state = run_next_scale_loop(
                family,
                condition,
                schedule,
                batch_size,
                guidance,
                [1.0] * num_scales,
                generator,
                scheduler,
                None,
                on_scale_end,
                should_stop=lambda: self._interrupt,
                pass_runner=self._pass_runner,
                tables=self.schedule_tables,
            )
        return self._decode_output(
            state.f_hat, output_type, return_dict, per_image=isinstance(generator, (list, tuple))
        )


def build_tiny_toy_pipeline(seed: int = 0, depth: int = 6) -> ToyPipeline:
    """A random-weight ToyVAR pipeline (the toy's tiny builder)."""
    torch.manual_seed(seed)
    pipe = ToyPipeline(ToyTransformer(depth=depth).eval(), ToyTokenizer().eval())
    pipe.set_progress_bar_config(disable=True)
    return pipe


# ---------------------------------------------------------------------------------------------------------------------
# the toy's part of the FLOP meter
# ---------------------------------------------------------------------------------------------------------------------
TOY_FAMILY = ModelFamily(TOY, preset_model="toyvar-tiny", pipeline="toy_family:ToyPipeline", no_guidance=1.0)


@contextlib.contextmanager
def registered():
    """The toy family registered for the duration of the block (its one registration)."""
    register_model_family(TOY_FAMILY)
    try:
        yield TOY_FAMILY
    finally:
        unregister_model_family(TOY)
