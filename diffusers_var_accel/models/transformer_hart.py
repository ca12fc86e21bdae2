"""HART's text-to-image transformer (mit-han-lab/hart, arXiv:2410.10812), written from its published facts.

HART is a VAR-style next-scale transformer whose text conditioning is a *prefix*: the projected Qwen2 features of
the prompt are the tokens of the first pass, every later scale attends to their keys/values, and the head's AdaLN
is conditioned on their maximum over positions. Blocks are llama-like (one shared RMSNorm, attention with q/v biases
and softmax scale ``0.25/sqrt(c)``, gated SiLU MLP) without per-block modulation. Context tokens get 1D RoPE at their
text positions; image tokens get HART's 2D RoPE on coordinates rescaled to the last scale and offset by the text
length. The last scale also feeds a residual diffusion MLP (:mod:`.diffusion_head_hart`) that adds the continuous
part of the latent.

Parameter names follow the official ``HARTForT2I`` state dict except ``diffloss.*`` -> ``diffusion_head.*``;
:func:`convert_hart_checkpoint` maps one to the other and :meth:`HARTTransformer.from_original_checkpoint` loads the
released ``llm/`` folder strictly.

Shape legend: ``B`` prompts, ``R`` rows (``2B`` under CFG: conditional rows first), ``T`` context tokens, ``L``
tokens, ``C`` width, ``D`` context width (Qwen2), ``Cv`` tokenizer channels, ``V`` codebook size, ``H`` heads, ``c``
head dim.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from diffusers.utils.accelerate_utils import apply_forward_hook

from .lora import VARPeftAdapterMixin
from .step_caches import VARStepCacheMixin
from .attention_processor import FusedProjection, HARTAttnProcessor, VARAttentionMixin, VARAttentionModuleMixin
from .checkpoint_utils import StrictLoadingMixin, build_and_load_strict, check_state_dict, load_original_state_dict
from .diffusion_head_hart import HARTDiffusionHead
from ..next_scale.context import VARForwardContext
from ..next_scale.executor import execute_blocks, run_sublayer
from .dtype_utils import compute_dtype

#: HART-0.7B at 1024x1024 (ARCHITECTURE facts: 24 x 1536 llama blocks, 300 Qwen2-1.5B context tokens, 14 scales,
#: 4096-entry codebook of 32 channels, 37M-parameter diffusion MLP with 8 sampling steps). The released
#: ``llm/config.json`` is authoritative when loading the checkpoint; this table serves FLOP counts and random builds.
HART_CONFIGS: Dict[str, Dict] = {
    "hart-0.7b": dict(
        depth=24,
        embed_dim=1536,
        num_heads=24,
        mlp_ratio=4.0,
        context_tokens=300,
        context_dim=1536,
        use_context_norm=True,
        attn_l2_norm=False,
        patch_nums=(1, 2, 3, 4, 5, 7, 9, 12, 16, 21, 27, 36, 48, 64),
        vocab_size=4096,
        token_channels=32,
        diffusion_width=1024,
        diffusion_depth=6,
        num_sampling_steps="8",
    ),
}

#: Official buffers that inference never reads (level ids and the training block-causal mask); the loader drops them.
IGNORED_ORIGINAL_KEYS = ("lvl_1L", "attn_bias_for_masking")

_MAX_SCALE_MUL = math.log(100.0)


def llama_mlp_hidden_size(embed_dim: int, mlp_ratio: float) -> int:
    """HART's gated-MLP width: two thirds of ``C * mlp_ratio`` rounded up to a multiple of 256."""
    return int((embed_dim * mlp_ratio * 2) / 3 + 255) // 256 * 256


def sinusoidal_embedding(t: torch.Tensor, dim: int = 256, max_period: float = 10000.0) -> torch.Tensor:
    """``[cos(t f_i), sin(t f_i)]`` with ``f_i = exp(-ln(max_period) i / (dim/2))``, in fp32 (DiT's timestep code)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t[:, None].float() * freqs[None]
    return torch.cat((torch.cos(args), torch.sin(args)), dim=-1)


class HARTRMSNorm(nn.Module):
    """RMSNorm computed in fp32, cast back to the input dtype, then scaled by the weight (HART's fused kernel)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, weight: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``weight``: ``self.weight`` already in ``x``'s dtype (a per-call constant), or ``None`` to cast it here."""
        x32 = x.float()
        normed = (x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)).to(x.dtype)
        return normed * (self.weight.to(x.dtype) if weight is None else weight)


class HARTLevelEmbedding(nn.Module):
    """Sinusoidal embedding of the level id (0 for context tokens, k for scale k) -> Linear -> SiLU -> Linear."""

    def __init__(self, embed_dim: int, frequency_dim: int = 256):
        super().__init__()
        self.frequency_dim = frequency_dim
        self.mlp = nn.Sequential(nn.Linear(frequency_dim, embed_dim), nn.SiLU(), nn.Linear(embed_dim, embed_dim))

    def forward(self, level_L: torch.Tensor) -> torch.Tensor:
        return self.mlp(sinusoidal_embedding(level_L, self.frequency_dim).to(compute_dtype(self.mlp[0])))


class HARTAttention(nn.Module, VARAttentionModuleMixin):
    """Llama-style self-attention of one HART block (weights only; :class:`HARTAttnProcessor` does the math)."""

    _default_processor_cls = HARTAttnProcessor
    _available_processors = [HARTAttnProcessor]
    _supports_qkv_fusion = False

    def __init__(self, embed_dim: int, num_heads: int, layer_idx: int, attn_l2_norm: bool = False):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim={embed_dim} is not divisible by num_heads={num_heads}")
        self.num_heads, self.head_dim, self.layer_idx = num_heads, embed_dim // num_heads, layer_idx
        self.is_cross_attention = False
        self.attn_l2_norm = attn_l2_norm
        if attn_l2_norm:  # cosine attention: the learned per-head scale replaces the softmax scale
            self.max_scale_mul = _MAX_SCALE_MUL
            self.scale_mul_1H11 = nn.Parameter(torch.full((1, num_heads, 1, 1), 4.0).log())
            self.softmax_scale = 1.0
        else:
            self.softmax_scale = 0.25 / math.sqrt(self.head_dim)
        self.qkv_proj = FusedProjection(embed_dim, 3 * embed_dim)
        self.q_bias = nn.Parameter(torch.zeros(embed_dim))
        self.v_bias = nn.Parameter(torch.zeros(embed_dim))
        self.register_buffer("zero_k_bias", torch.zeros(embed_dim))
        self.proj = nn.Linear(embed_dim, embed_dim)
        self.set_processor(HARTAttnProcessor())

    # Copied from diffusers_var_accel.models.transformer_infinity.InfinitySelfAttention.forward
    def forward(
        self,
        hidden_states_RLC,
        context: VARForwardContext,
        rope_cos_sin: Optional[torch.Tensor] = None,
        scale_ids: Optional[torch.Tensor] = None,
    ):
        return self.processor(self, hidden_states_RLC, context=context, rope_cos_sin=rope_cos_sin, scale_ids=scale_ids)

    # Copied from diffusers_var_accel.models.transformer_infinity.InfinitySelfAttention.extra_repr
    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, head_dim={self.head_dim}, layer_idx={self.layer_idx}"


class HARTFeedForward(nn.Module):
    """``down(silu(gate(x)) * up(x))`` without biases."""

    def __init__(self, embed_dim: int, hidden_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(embed_dim, hidden_size, bias=False)
        self.up_proj = nn.Linear(embed_dim, hidden_size, bias=False)
        self.down_proj = nn.Linear(hidden_size, embed_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


@dataclass
class HARTCondition:
    """The text conditioning of every row of one call.

    Args:
        context_RTC: projected context tokens ``context_embed(context_norm(text))``, the first pass's input.
        head_cond_RC: their maximum over positions (padding included), the head's AdaLN condition.
        position_ids_RT: 1D RoPE positions of the context tokens.
        rope_offset_R: the text-length offset of the image tokens' 2D RoPE (the last context position id).
    """

    context_RTC: torch.Tensor
    head_cond_RC: torch.Tensor
    position_ids_RT: torch.Tensor
    rope_offset_R: torch.Tensor

    def select_rows(self, rows: slice) -> "HARTCondition":
        return HARTCondition(
            self.context_RTC[rows], self.head_cond_RC[rows], self.position_ids_RT[rows], self.rope_offset_R[rows]
        )


class HARTBlock(nn.Module):
    """One RMSNorm weight for both sublayers, no AdaLN, no gates; the residual stream::

        x = x + attn(rms(x))      # llama self-attention, 2D RoPE, the KV cache
        x = x + mlp(rms(x))       # gated SiLU MLP

    When the pass routes or records a sublayer of this block, its update goes through the executor
    (:func:`~diffusers_var_accel.next_scale.executor.run_sublayer`), as in :class:`InfinityBlock`.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        mlp_hidden: int,
        layer_idx: int,
        norm_eps: float = 1e-6,
        attn_l2_norm: bool = False,
    ):
        super().__init__()
        self.layer_idx = layer_idx
        self.ln_wo_grad = HARTRMSNorm(embed_dim, eps=norm_eps)
        self.attn = HARTAttention(embed_dim, num_heads, layer_idx, attn_l2_norm)
        self.ffn = HARTFeedForward(embed_dim, mlp_hidden)

    def forward(self, x: torch.Tensor, condition: HARTCondition, context: VARForwardContext) -> torch.Tensor:
        routes = context.routes
        if routes is None or not routes.acts_on_layer(self.layer_idx):  # every token: the stream as written above
            x = x + self.attn(self.rms(x, context), context)
            return x + self.ffn(self.rms(x, context))
        x = run_sublayer(
            self.layer_idx, "self_attn", x, lambda x_sub, ctx: self.attn(self.rms(x_sub, ctx), ctx), context
        )
        return run_sublayer(self.layer_idx, "ffn", x, lambda x_sub, ctx: self.ffn(self.rms(x_sub, ctx)), context)

    def rms(self, x: torch.Tensor, context: VARForwardContext) -> torch.Tensor:
        """The block's RMSNorm, its weight in the stream's dtype a per-call constant."""
        norm = self.ln_wo_grad
        weight = context.cached(("rms_weight", self.layer_idx, x.dtype), lambda: norm.weight.to(x.dtype))
        return norm(x, weight)


class HARTHeadNorm(nn.Module):
    """AdaLN before the head: ``rms(x) * (1 + scale) + shift`` from ``Linear(SiLU(cond))``."""

    def __init__(self, embed_dim: int, norm_eps: float = 1e-6):
        super().__init__()
        self.ln_wo_grad = HARTRMSNorm(embed_dim, eps=norm_eps)
        self.ada_lin = nn.Sequential(nn.SiLU(), nn.Linear(embed_dim, 2 * embed_dim))

    def forward(self, x_RLC: torch.Tensor, cond_RC: torch.Tensor) -> torch.Tensor:
        scale, shift = (
            self.ada_lin(cond_RC.to(compute_dtype(self.ada_lin[1]))).float().view(-1, 1, 2, x_RLC.shape[-1]).unbind(2)
        )
        return self.ln_wo_grad(x_RLC).float().mul(scale.add(1)).add_(shift)


# ---------------------------------------------------------------------------------------------------------------------
# model
# ---------------------------------------------------------------------------------------------------------------------
class HARTTransformer(
    StrictLoadingMixin,
    VARStepCacheMixin,  # before ModelMixin: its named_modules refuses diffusers' step-cache apply_* walks
    ModelMixin,
    ConfigMixin,
    VARAttentionMixin,
    VARPeftAdapterMixin,
):
    r"""HART's next-scale transformer with its discrete head and residual diffusion head.

    Args:
        depth (`int`): number of blocks.
        embed_dim (`int`): width C.
        num_heads (`int`): attention heads.
        mlp_ratio (`float`): the gated MLP is ``llama_mlp_hidden_size(C, mlp_ratio)`` wide.
        norm_eps (`float`): RMSNorm epsilon.
        context_tokens (`int`): text tokens T per prompt (prompts are padded/truncated to it).
        context_dim (`int`): width D of the text features.
        use_context_norm (`bool`): RMSNorm on the text features before ``context_embed``.
        attn_l2_norm (`bool`): cosine attention with a learned per-head scale (the 0.7B model does not use it).
        patch_nums (`tuple[int]`): side of every scale; scale 0 is predicted from the context tokens.
        vocab_size (`int`): codebook size V of the tokenizer.
        token_channels (`int`): channels Cv of the tokenizer's latent.
        diffusion_width (`int`): width of the residual diffusion MLP.
        diffusion_depth (`int`): number of residual blocks of the diffusion MLP.
        num_sampling_steps (`str`): IDDPM respacing of the diffusion head (``"8"``).
        rope_theta (`float`): RoPE base.
    """

    _supports_gradient_checkpointing = False
    _no_split_modules = ["HARTBlock"]
    # regional compilation: the gated MLPs, pure functions of their tokens (a block's layer index keys its KV-cache
    # slot, so whole blocks would compile once per block and shape)
    _repeated_blocks = ["HARTFeedForward"]
    _keep_in_fp32_modules = []
    # group offloading (models/group_offload.py): the blocks move group by group; the embeddings, heads and the
    # diffusion head are read by the loop outside ``forward`` and stay on the device for the call
    _group_offload_streamed_modules = ("blocks",)

    @register_to_config
    def __init__(
        self,
        depth: int = 24,
        embed_dim: int = 1536,
        num_heads: int = 24,
        mlp_ratio: float = 4.0,
        norm_eps: float = 1e-6,
        context_tokens: int = 300,
        context_dim: int = 1536,
        use_context_norm: bool = True,
        attn_l2_norm: bool = False,
        patch_nums: Sequence[int] = (1, 2, 3, 4, 5, 7, 9, 12, 16, 21, 27, 36, 48, 64),
        vocab_size: int = 4096,
        token_channels: int = 32,
        diffusion_width: int = 1024,
        diffusion_depth: int = 6,
        num_sampling_steps: str = "8",
        rope_theta: float = 10000.0,
    ):
        super().__init__()
        if list(patch_nums) != sorted(set(patch_nums)) or not patch_nums or patch_nums[0] != 1:
            raise ValueError(f"patch_nums must increase strictly from 1, got {list(patch_nums)}")
        C = embed_dim
        self.context_norm = HARTRMSNorm(context_dim, eps=norm_eps) if use_context_norm else None
        self.context_embed = nn.Linear(context_dim, C)
        self.lvl_embed = HARTLevelEmbedding(C)
        self.word_embed = nn.Linear(token_channels, C)
        hidden = llama_mlp_hidden_size(C, mlp_ratio)
        self.blocks = nn.ModuleList(HARTBlock(C, num_heads, hidden, i, norm_eps, attn_l2_norm) for i in range(depth))
        self.head_nm = HARTHeadNorm(C, norm_eps)
        self.head = nn.Linear(C, vocab_size)
        self.decoder_norm = HARTRMSNorm(C, eps=norm_eps)
        self.diffusion_head = HARTDiffusionHead(
            token_channels, C, diffusion_width, diffusion_depth, num_sampling_steps
        )
        self.refuse_step_cache_hooks()

    def _inv_freq(self, step: int, device) -> torch.Tensor:
        """RoPE frequencies ``1/theta^(i/c)`` for i = 0, step, 2 step, ... (1D context: step 2; 2D images: step 4)."""
        head_dim = self.config.embed_dim // self.config.num_heads
        return 1.0 / self.config.rope_theta ** (torch.arange(0, head_dim, step, device=device).float() / head_dim)

    # -- conditioning -------------------------------------------------------------------------------------------------
    @apply_forward_hook
    def encode_condition(self, context_RTD: torch.Tensor, position_ids_RT: torch.Tensor) -> HARTCondition:
        """Project the text features of every row (conditional rows first, then the unconditional ones)."""
        T = self.config.context_tokens
        if context_RTD.ndim != 3 or context_RTD.shape[1:] != (T, self.config.context_dim):
            raise ValueError(
                f"HART expects text features of shape (rows, {T}, {self.config.context_dim}); got {tuple(context_RTD.shape)}"
            )
        if position_ids_RT.shape != context_RTD.shape[:2]:
            raise ValueError(
                f"position ids {tuple(position_ids_RT.shape)} do not match the text features {tuple(context_RTD.shape[:2])}"
            )
        x = context_RTD.to(compute_dtype(self.context_embed))
        if self.context_norm is not None:
            x = self.context_norm(x)
        context = self.context_embed(x)
        return HARTCondition(context, context.max(dim=1).values, position_ids_RT.long(), position_ids_RT[:, -1].long())

    def null_context(self, batch_size: int, device=None, dtype=torch.float32) -> Tuple[torch.Tensor, torch.Tensor]:
        """The unconditional text of the official sampler: all-zero features at position 0."""
        T, D = self.config.context_tokens, self.config.context_dim
        return (
            torch.zeros(batch_size, T, D, device=device, dtype=dtype),
            torch.zeros(batch_size, T, device=device, dtype=torch.long),
        )

    # -- inputs ---------------------------------------------------------------------------------------------------------
    @apply_forward_hook
    def embed_start(
        self, condition: HARTCondition, level_embeddings_TC: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """Tokens of the first pass: the projected context plus the level-0 embedding."""
        if level_embeddings_TC is None:
            T = condition.context_RTC.shape[1]
            level_embeddings_TC = self.lvl_embed(torch.zeros(T, device=condition.context_RTC.device, dtype=torch.long))
        return condition.context_RTC + level_embeddings_TC.unsqueeze(0)

    @apply_forward_hook
    def embed_scale_inputs(
        self, inputs_RLd: torch.Tensor, level_index_L: torch.Tensor, level_embeddings_LC: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """``word_embed(latent input) + level embedding`` (scale k has level k).

        ``level_embeddings_LC`` may give the level embedding of every token directly (see :meth:`level_embeddings`).
        """
        if level_embeddings_LC is None:
            level_embeddings_LC = self.lvl_embed(level_index_L)
        return self.word_embed(inputs_RLd) + level_embeddings_LC.unsqueeze(0)

    @apply_forward_hook
    def level_embeddings(self) -> torch.Tensor:
        """The level embedding of every position of a generation, ``(T + sum(pn^2) - 1, C)``: T context tokens at
        level 0, then the tokens of scales 1.. at their level, computed in one call as the official model does (a
        matmul's rounding depends on its row count, so this reproduces its values exactly, not just closely)."""
        patch_nums, T = self.config.patch_nums, self.config.context_tokens
        device = self.word_embed.weight.device
        levels = [torch.zeros(T, dtype=torch.long, device=device)]
        levels += [
            torch.full((pn * pn,), k, dtype=torch.long, device=device) for k, pn in enumerate(patch_nums) if k > 0
        ]
        return self.lvl_embed(torch.cat(levels))

    def context_rope(self, position_ids_RT: torch.Tensor) -> torch.Tensor:
        """Llama 1D RoPE table ``(2, R, 1, T, c)`` of the context tokens (cos/sin laid out ``[f, f]``)."""
        freqs = position_ids_RT.float().unsqueeze(-1) * self._inv_freq(2, position_ids_RT.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return torch.stack((emb.cos(), emb.sin())).unsqueeze(2)

    def image_rope(self, side: int, rope_offset_R: torch.Tensor) -> torch.Tensor:
        """HART's 2D RoPE table ``(2, R, 1, side^2, c)`` of one scale's tokens (row-major).

        Token (r, q) sits at ``X = r / side * P + offset``, ``Y = q / side * P + offset`` (P the last side, offset
        the row's text length - 1) and its cos/sin are laid out ``[X g, X g, Y g, Y g]``; the llama pairing of
        channel j with j + c/2 then mixes the two axes, exactly as the official model.
        """
        P = self.config.patch_nums[-1]
        device = rope_offset_R.device
        axis = torch.arange(side, device=device)
        grid = torch.stack(torch.meshgrid(axis, axis, indexing="ij"), dim=-1).reshape(-1, 2)
        coords = grid / side * P  # (L, 2) fp32, as (index / side) * P
        positions = coords.unsqueeze(0) + rope_offset_R.view(-1, 1, 1)  # (R, L, 2)
        freqs = positions.float().unsqueeze(-1) * self._inv_freq(4, device)  # (R, L, 2, c/4)
        emb = torch.cat((freqs, freqs), dim=-1).flatten(2)  # (R, L, c): [Xg, Xg, Yg, Yg]
        return torch.stack((emb.cos(), emb.sin())).unsqueeze(2)

    # -- blocks and heads -----------------------------------------------------------------------------------------------
    def forward(
        self, hidden_states_RLC: torch.Tensor, condition: HARTCondition, context: VARForwardContext
    ) -> torch.Tensor:
        """Run every block on the tokens of one pass (the caller owns the KV cache in ``context``)."""
        routes = context.routes
        if routes is not None and routes.acts_on_blocks:
            return execute_blocks(self.blocks, hidden_states_RLC, condition, context)
        for block in self.blocks:
            hidden_states_RLC = block(hidden_states_RLC, condition, context)
        return hidden_states_RLC

    @apply_forward_hook
    def head_logits(self, hidden_states_RLC: torch.Tensor, head_cond_RC: torch.Tensor) -> torch.Tensor:
        """Codebook logits (fp32) of every token: ``head(AdaLN(x, max-pooled context))``."""
        normed = self.head_nm(hidden_states_RLC.float(), head_cond_RC)
        return self.head(normed.to(compute_dtype(self.head))).float()

    @apply_forward_hook
    def diffusion_condition(self, hidden_states_RLC: torch.Tensor, codes_BLd: torch.Tensor) -> torch.Tensor:
        """Per-token condition of the diffusion head: ``decoder_norm(x + word_embed(codebook codes))``, all rows."""
        embedded = self.word_embed(codes_BLd.to(compute_dtype(self.word_embed)))
        embedded = embedded.repeat(hidden_states_RLC.shape[0] // codes_BLd.shape[0], 1, 1)
        return self.decoder_norm(hidden_states_RLC + embedded.to(hidden_states_RLC.dtype))

    # -- official checkpoints -------------------------------------------------------------------------------------------
    @classmethod
    def from_original_checkpoint(
        cls,
        llm_dir: Union[str, os.PathLike],
        use_ema: bool = True,
        torch_dtype: Optional[torch.dtype] = None,
    ) -> "HARTTransformer":
        """Load the official ``llm/`` folder (``config.json`` + ``ema_model.bin`` or the main weights) strictly.

        Args:
            llm_dir: the released ``llm/`` folder.
            use_ema: load ``ema_model.bin`` (what the official scripts generate with, their default); otherwise
                ``model.safetensors`` / ``pytorch_model.bin``.
            torch_dtype: dtype of the floating-point weights (fp32 by default).

        Raises:
            ValueError: an unsupported architecture flag in ``config.json``, or a state dict whose keys or shapes do
                not match (every missing, unexpected and mis-shaped key is listed).
            FileNotFoundError: the weights file is absent.
        """
        llm_dir = os.fspath(llm_dir)
        with open(os.path.join(llm_dir, "config.json")) as f:
            original_config = json.load(f)
        if use_ema:
            weights = os.path.join(llm_dir, "ema_model.bin")
        else:
            candidates = [os.path.join(llm_dir, n) for n in ("model.safetensors", "pytorch_model.bin")]
            weights = next((p for p in candidates if os.path.isfile(p)), candidates[0])
        state_dict = load_original_state_dict(weights)
        config = hart_config_from_original(original_config, state_dict)
        what = f"HART checkpoint {weights}"

        def convert(sd, expected):
            # check in the checkpoint's own names, so an error names keys the user can find in the file
            check_state_dict(
                {original_hart_key(k): v for k, v in expected.items()},
                {k: v for k, v in sd.items() if k not in IGNORED_ORIGINAL_KEYS},
                what,
            )
            return convert_hart_checkpoint(sd)

        return build_and_load_strict(cls, config, state_dict, what, torch_dtype, convert=convert)


def hart_config_from_original(original: Dict, state_dict: Optional[Dict[str, torch.Tensor]] = None) -> Dict:
    """Our config from the official ``HARTForT2IConfig`` dict (codebook size and channels from the weights).

    Raises a ``ValueError`` naming every flag this implementation does not cover (they change the architecture).
    """
    supported = dict(
        attn_type="llama",
        mlp_type="llama",
        disable_aln=True,
        shared_aln=False,
        use_timestep_embed=True,
        use_cross_attn=False,
        sampler="iddpm",
    )
    bad = [
        f"{k}={original.get(k)!r} (supported: {v!r})"
        for k, v in supported.items()
        if k in original and original[k] != v
    ]
    if bad:
        raise ValueError("unsupported HART configuration: " + ", ".join(bad))
    config = dict(
        depth=original["depth"],
        embed_dim=original["embed_dim"],
        num_heads=original["num_heads"],
        mlp_ratio=original.get("mlp_ratio", 4.0),
        norm_eps=original.get("norm_eps", 1e-6),
        context_tokens=original["context_token"],
        context_dim=original["context_dim"],
        use_context_norm=bool(original.get("use_context_norm", False)),
        attn_l2_norm=bool(original.get("attn_l2_norm", False)),
        patch_nums=tuple(original["patch_nums"]),
        diffusion_width=original.get("diff_width", 1024),
        diffusion_depth=original.get("diff_depth", 6),
        num_sampling_steps=str(original.get("num_sampling_steps", "8")),
    )
    if state_dict is not None:
        if "head.weight" not in state_dict or "word_embed.weight" not in state_dict:
            raise ValueError("HART checkpoint lacks head.weight / word_embed.weight: cannot tell the codebook size")
        config["vocab_size"] = int(state_dict["head.weight"].shape[0])
        config["token_channels"] = int(state_dict["word_embed.weight"].shape[1])
    return config


def convert_hart_checkpoint(state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Official ``HARTForT2I`` keys -> ours: ``diffloss.`` becomes ``diffusion_head.``; unused buffers are dropped."""
    out = {}
    for key, value in state_dict.items():
        if key in IGNORED_ORIGINAL_KEYS:
            continue
        if key.startswith("diffloss."):
            key = "diffusion_head." + key[len("diffloss.") :]
        out[key] = value
    return out


def original_hart_key(key: str) -> str:
    """Our parameter name -> the official ``HARTForT2I`` one (the inverse of :func:`convert_hart_checkpoint`)."""
    return "diffloss." + key[len("diffusion_head.") :] if key.startswith("diffusion_head.") else key
