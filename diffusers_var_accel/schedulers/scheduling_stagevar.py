"""StageVAR (published as FasterVAR, arXiv 2512.16483, ICML 2026; not to be confused with FastVAR): stage-aware
acceleration of the fidelity stage, as its public code does it (``shared/docs/stagevar-spec.md``).

The semantic and structure stages (Infinity 1024²: the scales up to 32²) run untouched. In the fidelity stage:

1. **Guidance off towards the unconditional model** ("cfg = 0" in the code): only the unconditional rows run (null
   text, their AdaLN and head condition, their own KV history) and the scale is sampled from their logits (spec §2.1;
   the loop's ``ScalePlan.cfg_uncond_only``).
2. **Random-projection low-rank features** at the projected scales (spec §2.2): each chunk of blocks runs on ``r``
   mixtures ``Y = Q^T X`` of the scale's tokens, ``Q ~ N(0, 1/r)`` of shape ``(N, r)``, with the RoPE positions of
   the first ``r`` raster tokens (Infinity's code) or of the drawn write positions (HART's: ``mixture_positions``);
   ``r_j = int(ratio_j N) + 1`` (Infinity) or ``int(ratio_j min(N, C)) + 1`` (HART: ``rank_basis``) from a per-chunk
   table of energy ratios (HART's chunks are its layers).
3. **Representative-token restoration** (spec §2.3-2.4): the chunk's ``r`` outputs are written at ``r`` positions drawn
   without replacement with probability ``||x_i||^2 / sum_k ||x_k||^2`` (``x`` the chunk's input; the ``k``-th
   mixture at the ``k``-th drawn position) onto the area-upsampled output of the same chunk at the previous scale.
4. The released Infinity code skips the last two scales (48², 64²; spec §2.7): ``skipped_scales``. HART's skips none.

Decisions where the spec lists an ambiguity (§6), stated here and in the docs:

* Draws (§3, #9): the official code draws the positions and projections from the process's global generator, which
  nothing seeds. Here they come from a generator of the call: ``projection_seed`` when given (the official draw order
  on one CPU generator: per chunk, the positions then the projection; ``torch.manual_seed(s)`` before the official
  call gives the same draws), else each image's generator's initial seed plus 12345 (InfinityStar's rule), one
  generator per image, so each image of a batch is independent of the others.
* Batch > 1 (#8): rows draw in order, each from its image's generator (the official code handles one image).
* Non-square scales (#8): the canvas is interpolated to ``(h, w)``; the ranks count the scale's tokens.
* "CFG = 0" (#2) is the unconditional rows on both models, as both releases run it (HART's own formula at t = 0
  would be the conditional rows).
* The positions are drawn with ``multinomial``'s exponential race without its host checks
  (:func:`draw_without_replacement`: the same positions, sync-free).

Shape legend: ``B`` images, ``R`` rows the pass runs, ``N`` tokens of the scale, ``C`` width, ``r`` mixtures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from diffusers.configuration_utils import register_to_config
from diffusers.schedulers.scheduling_utils import SchedulerMixin  # noqa: F401 (diffusers' from_pretrained looks the
#   loadable base class up in the module named in model_index.json)

from ..next_scale.plan import MIXTURE_ROPE_POSITIONS, EarlierScale, MixingRoute, PassRoutes, RecordRequest, ScalePlan
from .presets import PackagedPresets
from .scheduling_var_base import VARAccelScheduler, resolve_scale_index

#: The offset InfinityStar adds to the call's seed for its projection generator (``g_seed + 12345``).
SEED_OFFSET = 12345

#: The energy ratios of Infinity-2B's 8 block chunks at 40², 48² and 64² for ``alpha = 0.96`` (FasterVAR's
#: ``Infinity/infinity/utils/rank_ratio.py``; the release uses the 40² row only): :meth:`StageVARScheduler.paper_variant`.
PAPER_RANK_RATIOS = (
    (
        0.016776672694393688,
        0.13648282097649195,
        0.21039203774864412,
        0.2502819846292948,
        0.2558836742766729,
        0.1978790404611215,
        0.1570015822784809,
        0.19090034471066883,
    ),
    (
        0.01340312164472197,
        0.11730736289274413,
        0.18940610695919982,
        0.22199534852509042,
        0.23464176667749773,
        0.1827823024977396,
        0.1339092565057075,
        0.16311154356916818,
    ),
    (
        0.008212925943716094,
        0.054404177674333185,
        0.08323539747683092,
        0.06649410530628391,
        0.05667185998954566,
        0.02967688231097423,
        0.038260875515653256,
        0.05566317953209765,
    ),
)


#: The constant ``c`` of the official ``representative_token_indices`` (a lower bound on probabilities in the paper's
#: sampling scheme; it cancels mathematically when the probabilities are normalised again, but not in float32).
PROBABILITY_CONSTANT = 0.1


def representative_probabilities(x_RNC: torch.Tensor) -> torch.Tensor:
    """Spec §2.3: ``pi_i = ||x_i||^2 / sum_k ||x_k||^2`` per row, in fp32 ``(R, N)``, computed in the official
    expression's float32 order: the row norms squared (``torch.norm(x, dim=2) ** 2``), scaled by
    :data:`PROBABILITY_CONSTANT` over their sum, then normalised again. Both releases use this one expression
    (FasterVAR's ``Infinity/utils/low_rank_feature.py`` and ``hart/hart/utils/low_rank_feature.py``). Its rounding
    matters: the positions are an exponential race on these values, and ``x.square().sum(-1) / sum`` rounds a
    near-tie (one ulp apart) the other way, which swaps two draws and changes the run from that chunk on."""
    row_norm2_RN = torch.norm(x_RNC.float(), dim=-1) ** 2
    probs_RN = PROBABILITY_CONSTANT * row_norm2_RN / row_norm2_RN.sum(dim=-1, keepdim=True)
    return probs_RN / probs_RN.sum(dim=-1, keepdim=True)


def stage_rank(ratio: float, num_tokens: int, width: Optional[int] = None) -> int:
    """Spec §2.2: ``r = int(ratio N) + 1`` (Infinity's code), or ``int(ratio min(N, C)) + 1`` given the width ``C``
    (HART's code); at most ``N``."""
    basis = num_tokens if width is None else min(num_tokens, width)
    return min(num_tokens, int(ratio * basis) + 1)


def draw_without_replacement(probs_RN: torch.Tensor, num_samples: int, generator: torch.Generator) -> torch.Tensor:
    """``torch.multinomial(probs, num_samples, replacement=False, generator=generator)`` without its host-side checks
    of the probabilities (a device-to-host sync per call on CUDA): the exponential race ``topk(p / q)``,
    ``q ~ Exp(1)``, that ``multinomial`` itself computes without replacement, so the same positions in the same order
    from the same generator state, which it leaves where ``multinomial`` does (tested bit for bit on the CPU). Unlike
    ``multinomial`` it does not refuse a row with fewer non-zero probabilities than ``num_samples`` (it then takes
    zero-probability positions last); a token of zero norm is the only way to get one here."""
    race_RN = probs_RN / torch.empty_like(probs_RN).exponential_(generator=generator)
    return race_RN.topk(num_samples, dim=-1).indices


#: ``rank_basis`` values: what a chunk's energy ratio multiplies (spec §2.2 and §6 #4).
RANK_BASES = ("tokens", "tokens_or_width")


class RepresentativeMixer:
    """The draws of one chunk (spec §2.2-2.3), made on the stream entering it: per row, ``r`` write positions without
    replacement by squared-norm probability, then the projection ``randn(N, r) / sqrt(r)``, from that row's
    generator (in this order, as the official code). ``r`` is :func:`stage_rank` of the chunk's energy ratio on the
    stream's shape (``rank_basis``: ``"tokens"``, ``N``; ``"tokens_or_width"``, ``min(N, C)``)."""

    def __init__(self, ratio: float, generators: Sequence[torch.Generator], rank_basis: str = "tokens"):
        self.ratio, self.generators, self.rank_basis = ratio, list(generators), rank_basis

    def rank(self, num_tokens: int, width: int) -> int:
        return stage_rank(self.ratio, num_tokens, width if self.rank_basis == "tokens_or_width" else None)

    def __call__(self, x_RNC: torch.Tensor):
        R, N, C = x_RNC.shape
        rank = self.rank(N, C)
        if len(self.generators) != R:
            raise ValueError(f"the mixer has {len(self.generators)} generators for {R} rows")
        if x_RNC.is_meta:  # a shape-only run (FLOP counting): no values to draw from
            return (
                torch.empty(R, rank, dtype=torch.long, device="meta"),
                torch.empty(R, N, rank, dtype=torch.float32, device="meta"),
            )
        probs = representative_probabilities(x_RNC)  # in fp32 (the official code turns autocast off)
        positions, projections = [], []
        for row, generator in enumerate(self.generators):
            positions.append(draw_without_replacement(probs[row : row + 1], rank, generator))
            q = torch.randn(1, N, rank, generator=generator, device=x_RNC.device, dtype=torch.float32)
            projections.append(q * (1.0 / math.sqrt(rank)))
        return torch.cat(positions), torch.cat(projections)


@dataclass
class StageVARCallState:
    """What StageVAR keeps during one call: each chunk's output at the last scale that ran (the next projected
    scale's canvas), and the projection generators of the call's rows."""

    chunk_outputs: Dict[int, torch.Tensor] = field(default_factory=dict)
    source: Optional[Tuple[int, Tuple[int, int], bool]] = None  # (scale, (h, w), unconditional rows only)
    generators: Optional[List[torch.Generator]] = None


class StageVARScheduler(VARAccelScheduler, method="stagevar"):
    r"""StageVAR (FasterVAR): unconditional-only sampling in the fidelity stage, its chunks run on random mixtures of
    the tokens and restored onto the previous scale's upsampled output, the last scales skipped (the released code).

    Scale indices may be negative (``-1`` is the last scale). The released settings (the presets, and
    :meth:`paper_variant` for the paper's reading):

    * Infinity (1024², 13 scales): the last three scales unconditional, the first of them (40²) projected with the
      ``alpha = 0.96`` ranks of the 8 block chunks (``r = int(ratio N) + 1``, the mixtures at the first ``r``
      positions), the last two (48², 64²) skipped.
    * HART (14 scales): the last two scales (48², 64²) unconditional, the last projected layer by layer (24 chunks,
      ``r = int(ratio min(N, C)) + 1``, each mixture at its write position), nothing skipped.

    Args:
        unconditional_scales (`tuple[int]`, defaults to `(-3, -2, -1)`): scales run on the unconditional rows only
            (guidance off; they must end the scales that run).
        projected_scales (`tuple[int]`, defaults to `(-3,)`): scales whose chunks run on token mixtures.
        rank_ratios (`tuple[tuple[float]]`): per projected scale, one energy ratio per chunk (``r = int(ratio N) + 1``,
            or ``int(ratio min(N, C)) + 1``: ``rank_basis``).
        skipped_scales (`tuple[int]`, defaults to `(-2, -1)`): scales not run at all (no codes).
        num_chunks (`int`, defaults to 8): consecutive chunks the blocks are split into (Infinity's ``block_chunks``).
        projection_seed (`int`, *optional*): seed of one generator for every row's draws (the official draw order);
            `None`: each image's own generator's initial seed plus 12345.
        rank_basis (`str`, defaults to `"tokens"`): what a ratio multiplies: `"tokens"`, the scale's ``N`` tokens
            (Infinity's code); `"tokens_or_width"`, ``min(N, C)`` with ``C`` the model width (HART's code).
        mixture_positions (`str`, defaults to `"first"`): the positions (RoPE) the mixtures run at: `"first"`, the
            first ``r`` raster positions (Infinity's code); `"drawn"`, the ``k``-th mixture at the ``k``-th drawn
            write position (HART's code).
        model_family (`str`, *optional*): the model family the setting is for (a scheduler for another family is
            refused); `None`, the default, fits every family (`from_preset(family)` sets it).
    """

    presets = PackagedPresets("stagevar")
    call_state_class = StageVARCallState
    # the write positions are drawn with probabilities from the stream's norms: a batch's GEMMs round them apart from
    # a single image's, which can change a draw
    batch_equals_single_runs = False

    @property
    def draws_inside_passes(self) -> bool:  # type: ignore[override]
        """The mixers draw positions and projections inside the projected passes."""
        return bool(self.config.projected_scales)

    capturable_variant_note = (
        "no token mixtures (drawn inside the passes, which a graph cannot replay): projected scales run dense"
    )

    def capturable_variant(self) -> "StageVARScheduler":
        """The same settings without projected scales (their token mixtures are drawn inside the passes): the
        unconditional-only sampling and the skipped scales stay."""
        return type(self).from_config({**self.to_dict(), "projected_scales": (), "rank_ratios": ()})

    @register_to_config
    def __init__(
        self,
        unconditional_scales: Tuple[int, ...] = (-3, -2, -1),
        projected_scales: Tuple[int, ...] = (-3,),
        rank_ratios: Tuple[Tuple[float, ...], ...] = (
            (
                0.016776672694393688,
                0.13648282097649195,
                0.21039203774864412,
                0.2502819846292948,
                0.2558836742766729,
                0.1978790404611215,
                0.1570015822784809,
                0.19090034471066883,
            ),
        ),
        skipped_scales: Tuple[int, ...] = (-2, -1),
        num_chunks: int = 8,
        projection_seed: Optional[int] = None,
        rank_basis: str = "tokens",
        mixture_positions: str = "first",
        model_family: Optional[str] = None,
    ):
        super().__init__()
        self._check_family_name(model_family)
        for name, values in (
            ("unconditional_scales", unconditional_scales),
            ("projected_scales", projected_scales),
            ("skipped_scales", skipped_scales),
        ):
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in values) or len(set(values)) != len(
                values
            ):
                raise ValueError(
                    f"{name} must be distinct integer scale indices (negative = from the end), got {list(values)!r}"
                )
        if len(rank_ratios) != len(projected_scales):
            raise ValueError(
                f"rank_ratios needs one list per projected scale ({len(projected_scales)}), got {len(rank_ratios)}"
            )
        if isinstance(num_chunks, bool) or not isinstance(num_chunks, int) or num_chunks < 1:
            raise ValueError(f"num_chunks must be a positive integer, got {num_chunks!r}")
        for ratios in rank_ratios:
            if len(ratios) != num_chunks or not all(isinstance(v, (int, float)) and 0 <= v <= 1 for v in ratios):
                raise ValueError(
                    f"each rank_ratios entry must hold {num_chunks} ratios in [0, 1] (one per chunk), got {list(ratios)!r}"
                )
        if projection_seed is not None and (isinstance(projection_seed, bool) or not isinstance(projection_seed, int)):
            raise ValueError(f"projection_seed must be an integer or None, got {projection_seed!r}")
        if rank_basis not in RANK_BASES:
            raise ValueError(f"rank_basis must be one of {list(RANK_BASES)}, got {rank_basis!r}")
        if mixture_positions not in MIXTURE_ROPE_POSITIONS:
            raise ValueError(
                f"mixture_positions must be one of {list(MIXTURE_ROPE_POSITIONS)}, got {mixture_positions!r}"
            )

    @classmethod
    def paper_variant(cls, **overrides) -> "StageVARScheduler":
        """The paper's reading of Infinity-2B (spec §6 #1): the random projection and restoration over the whole
        fidelity stage (40², 48², 64², the released ``alpha = 0.96`` table of each), no scale skipped; otherwise the
        released Infinity preset. ``overrides`` as for the constructor. (HART's release has ratios for 64² only.)"""
        settings = {
            **cls.presets["infinity"],
            "projected_scales": (-3, -2, -1),
            "skipped_scales": (),
            "rank_ratios": PAPER_RANK_RATIOS,
        }
        cls._check_overrides(overrides)
        return cls(**{**settings, **overrides})

    # -- calibration ----------------------------------------------------------------------------------------------------
    @classmethod
    def calibration_grid(cls, num_layers: int) -> List[Dict[str, Any]]:
        """The scales without guidance (the last 1, 2 or 3: where the fidelity stage starts), the last 0, 1 or 2 of
        them skipped (fewer than all), and the random projection off, on the first unguided scale at a flat energy
        ratio of 25 or 50 % per chunk (the release's form), or on every unguided scale that runs at 25 % (the paper's
        form). The chunks are ``gcd(num_layers, 8)`` (Infinity's 8 block chunks where the depth allows). The released
        ratio tables (one ratio per chunk, per alpha) exist only for Infinity-2B's 40-64² and HART-0.7B's 64² scales,
        so a grid for any model takes flat ratios; the presets hold the released tables."""
        chunks = math.gcd(num_layers, 8)
        grid = []
        for unguided in (1, 2, 3):
            for skipped in range(unguided):  # fewer than all of them
                run = list(range(-unguided, -skipped if skipped else 0))  # the unguided scales that run
                base = dict(
                    unconditional_scales=list(range(-unguided, 0)),
                    skipped_scales=list(range(-skipped, 0)) if skipped else [],
                    num_chunks=chunks,
                )
                projections = [([], [])] + [([run[0]], [[ratio] * chunks]) for ratio in (0.25, 0.5)]
                if len(run) > 1:
                    projections.append((run, [[0.25] * chunks for _ in run]))
                for projected, ratios in projections:
                    grid.append(dict(base, projected_scales=projected, rank_ratios=ratios))
        return grid

    # -- the setting on one schedule ---------------------------------------------------------------------------------
    def _resolve(self, scale_schedule) -> Tuple[frozenset, Dict[int, Tuple[float, ...]], frozenset]:
        n = len(scale_schedule)
        c = self.config
        unconditional = frozenset(resolve_scale_index(k, n, "unconditional_scales") for k in c.unconditional_scales)
        projected = {
            resolve_scale_index(k, n, "projected_scales"): tuple(r) for k, r in zip(c.projected_scales, c.rank_ratios)
        }
        skipped = frozenset(resolve_scale_index(k, n, "skipped_scales") for k in c.skipped_scales)
        if 0 in skipped or 0 in projected:
            raise ValueError("scale 0 (the start token) is never skipped or projected")
        both = skipped & set(projected)
        if both:
            raise ValueError(f"scales {sorted(both)} are both skipped and projected")
        return unconditional, projected, skipped

    def chunks(self, num_layers: int) -> List[Tuple[int, int]]:
        """``[(first layer, end layer)]`` of the consecutive chunks (Infinity's ``block_chunks``)."""
        k = self.config.num_chunks
        if num_layers % k:
            raise ValueError(f"num_chunks={k} does not divide the model's {num_layers} layers")
        size = num_layers // k
        return [(j * size, (j + 1) * size) for j in range(k)]

    def plan_scales(self, scale_schedule, model=None):
        unconditional, _, skipped = self._resolve(scale_schedule)
        return [
            ScalePlan((k,), skip=k in skipped, cfg_uncond_only=k in unconditional and k not in skipped)
            for k in range(len(scale_schedule))
        ]

    def acted_scales(self, scale_schedule):
        """The unguided scales that run, the projected ones and their canvas sources (a scale StageVAR skips itself
        is no conflict when another member skips it too)."""
        unconditional, projected, skipped = self._resolve(scale_schedule)
        return (unconditional - skipped) | frozenset(projected) | frozenset(k - 1 for k in projected)

    # -- per pass -------------------------------------------------------------------------------------------------------
    def _generators(self, state, device: torch.device) -> List[torch.Generator]:
        """One projection generator per image, on ``device`` (see the module docstring)."""
        if device.type == "meta":  # a shape-only run draws nothing
            device = torch.device("cpu")
        if self.config.projection_seed is not None:  # one generator: the official draw order over every row
            return [torch.Generator(device).manual_seed(self.config.projection_seed)] * state.batch_size
        given = state.generator if isinstance(state.generator, (list, tuple)) else [state.generator] * state.batch_size
        return [
            torch.Generator(device).manual_seed((g.initial_seed() if g is not None else 0) + SEED_OFFSET)
            for g in given
        ]

    def route_pass(self, state, plan):
        """The pass before a projected scale records each chunk's output; a projected scale runs each chunk on
        mixtures (spec §2.2-2.4)."""
        _, projected, _ = self._resolve(state.scale_schedule)
        k = plan.scale_indices[0]
        grouped = [s for s in plan.scale_indices if s in projected]
        if grouped and len(plan.scale_indices) > 1:  # a group's pass has no previous scale of its own to restore onto
            raise ValueError(
                f"StageVAR projects scale {grouped[0]}, which is decoded in the group {list(plan.scale_indices)} "
                "(another member groups it); compose with projected_scales=() or project a scale outside the group"
            )
        chunks = self.chunks(state.model.num_layers)
        nxt = state.next_plan()
        record = (
            RecordRequest(block_outputs=frozenset(end - 1 for _, end in chunks))
            if (nxt is not None and nxt.scale_indices[0] in projected)
            else RecordRequest()
        )
        if k not in projected:
            return PassRoutes(record=record) if record else None
        call = self.call_state(state)
        if call.source is None or call.source[0] != k - 1:
            raise RuntimeError(
                f"StageVAR's canvas of scale {k} is the output of scale {k - 1}'s chunks, but that scale "
                "did not run (skipped or grouped?)"
            )
        _, source_hw, source_unconditional = call.source
        if call.generators is None:  # made at the first projected scale, on the model's device, kept for the call
            call.generators = self._generators(state, next(iter(call.chunk_outputs.values())).device)
        B = state.batch_size
        layout = state.layout.for_plan(plan)
        # this pass's rows of the previous scale's chunk outputs (the unconditional half of a full pass, when only
        # the unconditional rows run now)
        if layout.halved and not source_unconditional:
            rows = layout.run_slice
        else:
            rows = slice(0, None)
        generators = [call.generators[row % B] for row in range(layout.run_rows)]  # each row draws from its image's
        routes = PassRoutes(record=record)
        for j, (start, end) in enumerate(chunks):
            canvas = EarlierScale(call.chunk_outputs[end - 1][rows], source_hw, mode="area")
            mixer = RepresentativeMixer(projected[k][j], generators, self.config.rank_basis)
            routes.mixing[start] = MixingRoute(end, mixer, canvas, rope_positions=self.config.mixture_positions)
        return routes

    def after_scale(self, state, plan, hidden_states_RLC):
        outputs = state.records.block_outputs
        if not outputs:
            return
        k = plan.scale_indices[0]
        call = self.call_state(state)
        call.chunk_outputs = dict(outputs)
        call.source = (k, tuple(int(v) for v in state.scale_schedule[k][-2:]), plan.cfg_uncond_only)
