"""HART's residual diffusion head: a small AdaLN MLP that samples, per token of the last scale, the continuous residual
which the discrete codebook vector misses.

HART (https://arxiv.org/abs/2410.10812) borrows the head from MAR (https://arxiv.org/abs/2406.11838, "DiffLoss"): an
epsilon-predicting MLP conditioned on the transformer's hidden state of the token, sampled with the IDDPM ancestral
sampler (https://arxiv.org/abs/2102.09672) on a 1000-step cosine schedule respaced to a few steps (8 for HART-0.7B),
with learned-range variances and classifier-free guidance on epsilon.

The module tree of ``net`` mirrors the official ``SimpleMLPAdaLN`` (mit-han-lab/hart,
``hart/modules/diffusion/diffloss.py``): the official keys ``diffloss.net.*`` without ``diffloss.`` load directly
into [`HARTDiffusionHead`]. The schedule tables are not parameters or buffers (they are rebuilt from the config).

Shape-suffix legend: ``N`` tokens (B * P * P for a batch), ``Cv`` token channels (the tokenizer's ``z_channels``),
``C`` condition channels (the transformer width), ``W`` the MLP width.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Union

import numpy as np
import torch
from torch import nn

from .dtype_utils import compute_dtype

__all__ = [
    "HARTDiffusionHead",
    "HARTDiffusionMLP",
    "cosine_betas",
    "diffusion_head_state_dict_from_original",
    "hart_diffusion_head_config_from_original",
    "space_timesteps",
]

#: The official ``DiffLoss.vae_scale``: the head is trained on ``residual / 0.6`` and its samples are multiplied back.
LATENT_SCALE = 0.6
#: Prefix of the head's keys in the official ``HARTForT2I`` state dict.
_ORIGINAL_PREFIX = "diffloss."


# ---------------------------------------------------------------------------------------------------- schedule


def cosine_betas(num_timesteps: int = 1000, max_beta: float = 0.999) -> np.ndarray:
    """Betas of the IDDPM cosine schedule, ``alpha_bar(s) = cos^2((s + 0.008) / 1.008 * pi / 2)``, float64.

    Computed with Python floats one step at a time, as the official ``betas_for_alpha_bar``, so the tables (and the
    respaced ones derived from them) agree with the official bit for bit.
    """

    def alpha_bar(s: float) -> float:
        return math.cos((s + 0.008) / 1.008 * math.pi / 2) ** 2

    betas = [
        min(1 - alpha_bar((i + 1) / num_timesteps) / alpha_bar(i / num_timesteps), max_beta)
        for i in range(num_timesteps)
    ]
    return np.array(betas, dtype=np.float64)


def space_timesteps(num_timesteps: int, section_counts: Union[str, int, Sequence[int]]) -> Set[int]:
    """Timesteps of a ``num_timesteps`` process kept by the IDDPM respacing rule.

    ``section_counts`` is ``"ddimN"`` (stride giving exactly N steps), a comma-separated string / list of counts (the
    process is cut into that many equal sections, each strided evenly, with Python's round-half-to-even), or an int.
    ``"8"`` of 1000 gives {0, 143, 285, 428, 571, 714, 856, 999}; ``"4"`` gives {0, 333, 666, 999}.
    """
    if isinstance(section_counts, str):
        if section_counts.startswith("ddim"):
            wanted = int(section_counts[len("ddim") :])
            for stride in range(1, num_timesteps):
                if len(range(0, num_timesteps, stride)) == wanted:
                    return set(range(0, num_timesteps, stride))
            raise ValueError(f"cannot create exactly {wanted} steps out of {num_timesteps} with an integer stride")
        counts = [int(c) for c in section_counts.split(",")]
    elif isinstance(section_counts, numbers.Integral):
        counts = [int(section_counts)]
    else:
        counts = [int(c) for c in section_counts]
    base, extra = divmod(num_timesteps, len(counts))
    kept: List[int] = []
    start = 0
    for i, count in enumerate(counts):
        size = base + (1 if i < extra else 0)
        if count < 1 or size < count:
            raise ValueError(f"cannot divide a section of {size} steps into {count}")
        stride = 1 if count <= 1 else (size - 1) / (count - 1)
        position = 0.0
        for _ in range(count):
            kept.append(start + round(position))
            position += stride
        start += size
    return set(kept)


class _RespacedSchedule:
    """float64 tables of the respaced process, as the official ``SpacedDiffusion`` / ``GaussianDiffusion``."""

    def __init__(self, num_sampling_steps: Union[str, int, Sequence[int]], num_train_timesteps: int):
        base_betas = cosine_betas(num_train_timesteps)
        base_alphas_cumprod = np.cumprod(1.0 - base_betas, axis=0)
        kept = space_timesteps(num_train_timesteps, num_sampling_steps)
        # New betas from the kept cumulative alphas; the tables below are then recomputed from these betas (the
        # official re-runs the cumulative product, which rounds differently from the kept values).
        timestep_map, new_betas, last = [], [], 1.0
        for i, alpha_cumprod in enumerate(base_alphas_cumprod):
            if i in kept:
                new_betas.append(1 - alpha_cumprod / last)
                last = alpha_cumprod
                timestep_map.append(i)
        betas = np.array(new_betas, dtype=np.float64)
        if len(betas) < 2:
            raise ValueError(
                f"num_sampling_steps={num_sampling_steps!r} keeps {len(betas)} step(s); at least 2 needed"
            )
        alphas_cumprod = np.cumprod(1.0 - betas, axis=0)
        alphas_cumprod_prev = np.append(1.0, alphas_cumprod[:-1])
        posterior_variance = betas * (1.0 - alphas_cumprod_prev) / (1.0 - alphas_cumprod)
        self.timestep_map: List[int] = timestep_map
        self.betas = betas
        self.alphas_cumprod = alphas_cumprod
        self.sqrt_recip_alphas_cumprod = np.sqrt(1.0 / alphas_cumprod)
        self.sqrt_recipm1_alphas_cumprod = np.sqrt(1.0 / alphas_cumprod - 1)
        # The posterior variance is 0 at the first step; its log is taken after replacing it by the second entry.
        self.posterior_log_variance_clipped = np.log(np.append(posterior_variance[1], posterior_variance[1:]))
        self.log_betas = np.log(betas)
        self.posterior_mean_coef1 = betas * np.sqrt(alphas_cumprod_prev) / (1.0 - alphas_cumprod)
        self.posterior_mean_coef2 = (1.0 - alphas_cumprod_prev) * np.sqrt(1.0 - betas) / (1.0 - alphas_cumprod)

    def float32_tables(self) -> Dict[str, torch.Tensor]:
        """The per-step coefficients as float32 tensors: the official gathers the float64 value and casts it with
        ``.float()``, so every coefficient enters the arithmetic rounded to float32 (done here once)."""
        names = (
            "sqrt_recip_alphas_cumprod",
            "sqrt_recipm1_alphas_cumprod",
            "posterior_log_variance_clipped",
            "log_betas",
            "posterior_mean_coef1",
            "posterior_mean_coef2",
        )
        return {name: torch.from_numpy(getattr(self, name)).float() for name in names}


# ---------------------------------------------------------------------------------------------------- network


def _modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale) + shift


class HARTTimestepEmbedder(nn.Module):
    """Sinusoidal embedding of a (float) timestep, 256 channels ``[cos | sin]``, then Linear -> SiLU -> Linear."""

    def __init__(self, width: int, frequency_channels: int = 256):
        super().__init__()
        self.frequency_channels = frequency_channels
        self.mlp = nn.Sequential(nn.Linear(frequency_channels, width), nn.SiLU(), nn.Linear(width, width))

    @staticmethod
    def frequencies(channels: int, max_period: float = 10000.0, device=None) -> torch.Tensor:
        """``f_i = exp(-ln(max_period) i / half)`` in float32, computed on the CPU by default (as the official code)."""
        half = channels // 2
        return torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=device) / half)

    @staticmethod
    def sinusoid(
        t_N: torch.Tensor, channels: int, max_period: float = 10000.0, freqs: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """``[cos(t f_i), sin(t f_i)]`` with ``f_i = exp(-ln(max_period) i / half)``, float32 (zero-padded if odd).

        ``freqs``: :meth:`frequencies` already on ``t``'s device (no upload per call), else computed here."""
        if freqs is None:
            freqs = HARTTimestepEmbedder.frequencies(channels, max_period).to(t_N.device)
        args = t_N[:, None].float() * freqs[None]
        emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        if channels % 2:
            emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
        return emb

    def forward(self, t_N: torch.Tensor, freqs: Optional[torch.Tensor] = None) -> torch.Tensor:
        emb = self.sinusoid(t_N, self.frequency_channels, freqs=freqs)
        return self.mlp(emb.to(compute_dtype(self.mlp[0])))


class HARTAdaLNResBlock(nn.Module):
    """``x + gate * MLP(LN(x) * (1 + scale) + shift)`` with ``(shift, scale, gate)`` from ``Linear(SiLU(y))``."""

    def __init__(self, width: int):
        super().__init__()
        self.in_ln = nn.LayerNorm(width, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(width, 3 * width))

    def forward(self, x_NW: torch.Tensor, y_NW: torch.Tensor) -> torch.Tensor:
        shift, scale, gate = self.adaLN_modulation(y_NW).chunk(3, dim=-1)
        return x_NW + gate * self.mlp(_modulate(self.in_ln(x_NW), shift, scale))


class HARTFinalLayer(nn.Module):
    """LayerNorm without affine, AdaLN ``(shift, scale)``, then a Linear to the outputs."""

    def __init__(self, width: int, out_channels: int):
        super().__init__()
        self.norm_final = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(width, out_channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(width, 2 * width))

    def forward(self, x_NW: torch.Tensor, y_NW: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(y_NW).chunk(2, dim=-1)
        return self.linear(_modulate(self.norm_final(x_NW), shift, scale))


class HARTDiffusionMLP(nn.Module):
    """The official ``SimpleMLPAdaLN``: ``y = time_embed(t) + cond_embed(c)``, ``x = input_proj(x)``, ``depth``
    AdaLN residual blocks, and a final layer with ``2 * Cv`` outputs (epsilon | variance interpolant in [-1, 1])."""

    def __init__(self, token_channels: int, condition_channels: int, width: int, depth: int):
        super().__init__()
        self.token_channels = token_channels
        self.time_embed = HARTTimestepEmbedder(width)
        self.cond_embed = nn.Linear(condition_channels, width)
        self.input_proj = nn.Linear(token_channels, width)
        self.res_blocks = nn.ModuleList([HARTAdaLNResBlock(width) for _ in range(depth)])
        self.final_layer = HARTFinalLayer(width, 2 * token_channels)

    def forward(
        self,
        x_NCv: torch.Tensor,
        t_N: torch.Tensor,
        c_NC: torch.Tensor,
        time_frequencies: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Raw output (N, 2 * Cv) for tokens ``x``, original-process timesteps ``t`` (N,) and conditions ``c``
        (``time_frequencies``: the timestep embedder's frequencies on ``t``'s device, if the caller holds them)."""
        x_NW = self.input_proj(x_NCv)
        y_NW = self.time_embed(t_N, time_frequencies) + self.cond_embed(c_NC)
        for block in self.res_blocks:
            x_NW = block(x_NW, y_NW)
        return self.final_layer(x_NW, y_NW)


# ---------------------------------------------------------------------------------------------------- head


class HARTDiffusionHead(nn.Module):
    r"""HART's residual diffusion head: the MLP ``net`` and its respaced IDDPM sampler with CFG.

    [`~HARTDiffusionHead.sample`] reproduces the official ``DiffLoss.sample(z, temperature, cfg)`` for the rows the
    generation loop keeps (see there).

    Args:
        token_channels (`int`): Cv, the tokenizer's latent channels.
        condition_channels (`int`): C, the transformer width (``embed_dim``).
        width (`int`): MLP width (official ``diff_width``, 1024 for HART-0.7B).
        depth (`int`): residual blocks (official ``diff_depth``, 6 for HART-0.7B).
        num_sampling_steps (`str`, *optional*, defaults to `"8"`): respacing of the 1000-step process (official
            ``num_sampling_steps``; see [`space_timesteps`]).
        num_train_timesteps (`int`, *optional*, defaults to 1000): length of the original process.
        latent_scale (`float`, *optional*, defaults to 0.6): factor applied to the samples (official ``vae_scale``).

    Examples:
        ```py
        >>> import torch
        >>> from diffusers_var_accel.models.diffusion_head_hart import HARTDiffusionHead

        >>> head = HARTDiffusionHead(token_channels=8, condition_channels=64, width=32, depth=2)
        >>> cond = torch.randn(2 * 5, 64)  # [cond rows | uncond rows]
        >>> head.sample(cond, guidance=3.0, generator=torch.Generator().manual_seed(0)).shape
        torch.Size([5, 8])
        ```
    """

    def __init__(
        self,
        token_channels: int,
        condition_channels: int,
        width: int,
        depth: int,
        num_sampling_steps: Union[str, int] = "8",
        num_train_timesteps: int = 1000,
        latent_scale: float = LATENT_SCALE,
    ):
        super().__init__()
        for name, value in (
            ("token_channels", token_channels),
            ("condition_channels", condition_channels),
            ("width", width),
            ("depth", depth),
            ("num_train_timesteps", num_train_timesteps),
        ):
            if int(value) < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.token_channels = int(token_channels)
        self.condition_channels = int(condition_channels)
        self.num_sampling_steps = num_sampling_steps
        self.latent_scale = float(latent_scale)
        self.net = HARTDiffusionMLP(self.token_channels, self.condition_channels, int(width), int(depth))
        self.schedule = _RespacedSchedule(num_sampling_steps, int(num_train_timesteps))
        # Plain attributes, not buffers: they stay float32 under module.to(dtype) and out of the state dict. With them,
        # the timestep map and the timestep embedder's frequencies: every constant of the sampler, moved with the
        # module (``_apply``), so a generation uploads nothing.
        self._tables = self.schedule.float32_tables()
        # on the CPU explicitly: a model built on the meta device (then loaded) still holds their values
        self._tables["timestep_map"] = torch.tensor(self.schedule.timestep_map, dtype=torch.long, device="cpu")
        self._tables["time_frequencies"] = HARTTimestepEmbedder.frequencies(
            self.net.time_embed.frequency_channels, device="cpu"
        )

    def _apply(self, fn, *args, **kwargs):
        """``module.to(device)`` also moves the constant tables (their dtypes stay: float32 and long)."""
        module = super()._apply(fn, *args, **kwargs)
        device = self.net.input_proj.weight.device
        if device.type != "meta":
            self._tables = {name: table.to(device) for name, table in self._tables.items()}
        return module

    def _constants_on(self, device: torch.device):
        """``(tables, timestep_map, time_frequencies)`` on ``device`` (moved here only when the module's weights
        were placed elsewhere by hooks, e.g. CPU offload)."""
        tables = self._tables
        if tables["timestep_map"].device != torch.device(device):
            tables = {name: table.to(device) for name, table in tables.items()}
        return tables, tables["timestep_map"], tables["time_frequencies"]

    @property
    def timestep_map(self) -> List[int]:
        """Original-process timestep of each respaced step (ascending); the network sees these values."""
        return list(self.schedule.timestep_map)

    @property
    def num_steps(self) -> int:
        """Number K of denoising steps (= network evaluations and per-step noise draws)."""
        return len(self.schedule.timestep_map)

    def extra_repr(self) -> str:
        return (
            f"token_channels={self.token_channels}, condition_channels={self.condition_channels}, "
            f"num_sampling_steps={self.num_sampling_steps!r}, latent_scale={self.latent_scale}"
        )

    @torch.no_grad()
    def sample(
        self,
        condition_2NC: torch.Tensor,
        guidance: float,
        generator: Optional[torch.Generator] = None,
        temperature: float = 1.0,
        initial_noise: Optional[torch.Tensor] = None,
        step_noises: Optional[Sequence[torch.Tensor]] = None,
    ) -> torch.Tensor:
        """Sample the continuous residual of N tokens with classifier-free guidance (official ``DiffLoss.sample``).

        Rows of ``condition_2NC`` are ``[cond_0 .. cond_{N-1} | uncond_0 .. uncond_{N-1}]``. As in the official code,
        both halves start from the same noise ``x`` (N rows, duplicated); at every step the network runs on
        ``[x | x]`` with the 2N conditions, ``eps = (1 + g) * eps_cond - g * eps_uncond``, the learned-range variance
        of the kept rows comes from the cond branch, ``x0`` is clamped to [-1, 1], and the posterior mean plus
        ``exp(logvar / 2) * noise * temperature`` (no noise at the last step) gives the next ``x``. The result is
        multiplied by ``latent_scale`` (0.6): **the x0.6 is included**, as it is inside the official
        ``DiffLoss.sample``.

        The official returns 2N rows and the loop keeps the first N; the other N (the unconditional branch's own
        trajectory, which never feeds back into the first half) are not computed here. So the return value equals
        rows ``[:N]`` of the official output (the fixture's ``diff_out[:N]``).

        Official quirk, reproduced: with ``guidance == 1.0`` exactly the official takes its no-CFG branch: it draws
        the initial noise for all 2N rows and every row follows its own branch unguided; the first N rows are then
        the unguided cond trajectory. Here: an initial draw of (2N, Cv) whose first N rows are used, and
        ``eps = eps_cond``.

        Randomness: with ``generator``, ``torch.randn(N, Cv)`` (``(2N, Cv)`` when ``guidance == 1.0``), then K times
        ``torch.randn(2N, Cv)`` (the last one is multiplied by 0), all float32 from ``generator`` on its device, then
        moved to the condition's device; rows ``[N:]`` of the step noise only drive the discarded half. With
        ``generator=None`` the initial noise comes from the global CPU generator and the step noise from the global
        generator of the condition's device, as the official code draws them. ``initial_noise`` / ``step_noises``
        override the draws (then nothing is drawn for them).

        Precision: the network runs in its parameter dtype; all sampler arithmetic is float32 with float32-rounded
        schedule coefficients (as the official code, whose fp32 gathered tables promote fp16 autocast outputs).

        Args:
            condition_2NC (`torch.Tensor`): (2N, C) conditions (the loop's ``decoder_norm`` output).
            guidance (`float` or `None`): guidance weight g for this call (one Python number; the loop's t of the
                last scale). `None`: no unconditional rows; ``condition`` is (N, C) and only the conditional branch
                runs, with the noise drawn as for guidance 0 (the official code always runs the CFG layout, with
                ``t = 0`` when guidance is off), so the result equals that of ``[cond | anything]`` at guidance 0.
            generator (`torch.Generator`, *optional*): source of the noise.
            temperature (`float`, *optional*, defaults to 1.0): factor on the per-step noise.
            initial_noise (`torch.Tensor`, *optional*): (N, Cv) initial noise; (2N, Cv) is accepted (first N rows).
            step_noises (`list[torch.Tensor]`, *optional*): K tensors of shape (2N, Cv) or (N, Cv), one per step from
                the highest timestep down; only their first N rows are used.

        Returns:
            `torch.Tensor`: (N, Cv) float32 residuals, already multiplied by ``latent_scale``.
        """
        cond_only = guidance is None
        if not cond_only and (
            isinstance(guidance, torch.Tensor) or isinstance(guidance, bool) or not isinstance(guidance, numbers.Real)
        ):
            raise TypeError(
                f"guidance must be a Python number (one weight per call) or None, got {type(guidance).__name__}"
            )
        guidance = 0.0 if cond_only else float(guidance)
        if (
            condition_2NC.ndim != 2
            or condition_2NC.shape[1] != self.condition_channels
            or (condition_2NC.shape[0] % 2 and not cond_only)
        ):
            expected = "(N, C) conditional rows" if cond_only else "(2N, C) with rows [cond | uncond]"
            raise ValueError(
                f"condition must have shape {expected} with C = {self.condition_channels}, got {tuple(condition_2NC.shape)}"
            )
        device = condition_2NC.device
        Cv = self.token_channels
        n = condition_2NC.shape[0] if cond_only else condition_2NC.shape[0] // 2
        two_n = 2 * n
        num_steps = self.num_steps
        # The official compares the weight to 1.0 exactly to pick its no-CFG branch (see the docstring).
        use_cfg = guidance != 1.0

        # 1. Initial noise: (N, Cv) with CFG, (2N, Cv) in the no-CFG branch; only N rows are ever used
        initial_rows = n if use_cfg else two_n
        if initial_noise is None:
            initial_noise = torch.randn(
                initial_rows, Cv, generator=generator, device=generator.device if generator is not None else "cpu"
            )
        elif initial_noise.shape not in ((n, Cv), (two_n, Cv)):
            raise ValueError(
                f"initial_noise must have shape ({n}, {Cv}) or ({two_n}, {Cv}), got {tuple(initial_noise.shape)}"
            )
        if step_noises is not None:
            if len(step_noises) != num_steps:
                raise ValueError(f"step_noises must hold {num_steps} tensors (one per step), got {len(step_noises)}")
            for i, noise in enumerate(step_noises):
                if noise.shape not in ((n, Cv), (two_n, Cv)):
                    raise ValueError(
                        f"step_noises[{i}] must have shape ({two_n}, {Cv}) or ({n}, {Cv}), got {tuple(noise.shape)}"
                    )
        x_NCv = initial_noise[:n].to(device=device, dtype=torch.float32)

        tables, timestep_map, time_frequencies = self._constants_on(device)
        net_dtype = compute_dtype(self.net.input_proj)
        condition_2NC = condition_2NC.to(net_dtype)

        # 2. Denoise from the last respaced step down to 0; the network sees the original timestep index
        for i in reversed(range(num_steps)):
            t_2N = timestep_map[i].expand(two_n)
            if cond_only:  # only the conditional branch: eps_cond is (1 + 0) eps_cond - 0 eps_uncond exactly
                out_2N2Cv = self.net(x_NCv.to(net_dtype), t_2N[:n], condition_2NC, time_frequencies).float()
                eps_cond = eps_uncond = out_2N2Cv[:, :Cv]
            else:
                x_in = torch.cat([x_NCv, x_NCv], dim=0).to(net_dtype)
                out_2N2Cv = self.net(x_in, t_2N, condition_2NC, time_frequencies).float()
                eps_cond, eps_uncond = out_2N2Cv[:n, :Cv], out_2N2Cv[n:, :Cv]
            if cond_only:
                eps_NCv = eps_cond
            elif use_cfg:
                eps_NCv = eps_cond * (1 + guidance) - guidance * eps_uncond
            else:
                eps_NCv = eps_cond
            var_interp_NCv = out_2N2Cv[:n, Cv:]  # each kept row's own (cond) branch

            # Learned-range log-variance between the clipped posterior variance and beta.
            frac = (var_interp_NCv + 1) / 2
            log_variance = frac * tables["log_betas"][i] + (1 - frac) * tables["posterior_log_variance_clipped"][i]
            x0_NCv = (
                tables["sqrt_recip_alphas_cumprod"][i] * x_NCv - tables["sqrt_recipm1_alphas_cumprod"][i] * eps_NCv
            ).clamp(-1, 1)
            mean_NCv = tables["posterior_mean_coef1"][i] * x0_NCv + tables["posterior_mean_coef2"][i] * x_NCv

            # The official draws this step's noise after the network call, also at the last step (then unused).
            if step_noises is not None:
                noise_NCv = step_noises[num_steps - 1 - i][:n]
            else:
                noise_NCv = torch.randn(
                    two_n, Cv, generator=generator, device=generator.device if generator is not None else device
                )[:n]
            if i != 0:
                x_NCv = (
                    mean_NCv
                    + torch.exp(0.5 * log_variance) * noise_NCv.to(device=device, dtype=torch.float32) * temperature
                )
            else:
                x_NCv = mean_NCv
        return x_NCv * self.latent_scale

    # ------------------------------------------------------------------ official checkpoints

    @classmethod
    def from_original_state_dict(
        cls,
        state_dict: Mapping[str, torch.Tensor],
        original_config: Mapping[str, Any],
        token_channels: int,
        torch_dtype: Optional[torch.dtype] = None,
    ) -> "HARTDiffusionHead":
        """Build the head from a full official ``HARTForT2I`` state dict (its ``diffloss.*`` slice) and the official
        ``llm/config.json`` contents, strictly (missing / unexpected / mis-shaped keys raise one `ValueError`)."""
        from .checkpoint_utils import build_and_load_strict

        config = hart_diffusion_head_config_from_original(original_config, token_channels)
        weights = diffusion_head_state_dict_from_original(state_dict)
        return build_and_load_strict(cls, config, weights, "HART diffusion head checkpoint", torch_dtype)


def diffusion_head_state_dict_from_original(state_dict: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """The ``diffloss.*`` entries of an official ``HARTForT2I`` state dict without the prefix (tensors shared)."""
    return {k[len(_ORIGINAL_PREFIX) :]: v for k, v in state_dict.items() if k.startswith(_ORIGINAL_PREFIX)}


def hart_diffusion_head_config_from_original(cfg_dict: Mapping[str, Any], token_channels: int) -> Dict[str, Any]:
    """[`HARTDiffusionHead`] arguments from an official ``HARTForT2IConfig`` dict and the tokenizer's Cv.

    Raises `ValueError` for a sampler other than ``"iddpm"`` (the only one the official code implements).
    """
    sampler = cfg_dict.get("sampler", "iddpm")
    if sampler != "iddpm":
        raise ValueError(f"sampler={sampler!r} is not supported (the official DiffLoss only implements 'iddpm')")
    return {
        "token_channels": int(token_channels),
        "condition_channels": int(cfg_dict.get("embed_dim", 1024)),
        "width": int(cfg_dict.get("diff_width", 1024)),
        "depth": int(cfg_dict.get("diff_depth", 6)),
        "num_sampling_steps": cfg_dict.get("num_sampling_steps", "8"),
    }
