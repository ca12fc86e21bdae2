"""The acceleration-scheduler protocol of the next-scale loop, and the identity scheduler (no acceleration).

A scheduler decides; the loop, the transformer's token-routing seam and the attention processors carry the
decision out. The loop consults a scheduler at these named extension points:

* :meth:`VARAccelScheduler.plan_scales` - one :class:`ScalePlan` per transformer pass: which scales it decodes
  (several = one pass with a block-causal mask), whether it is skipped, whether only the conditional CFG half runs,
  and whose self-attention maps are recorded.
* :meth:`VARAccelScheduler.before_scale` - called before each pass (read ``state``: f_hat, previous hidden states).
* :meth:`VARAccelScheduler.token_router` - a :class:`~diffusers_var_accel.models.forward_context.TokenRouter` for the
  pass: which tokens each block / sublayer computes (``select``) and how the others are restored (``restore``);
  per-token layer masks are a router that selects, per layer, the tokens that run it.
* :meth:`VARAccelScheduler.after_scale` - called after the pass, with its last hidden states and the recorded
  attention maps, before the next plan.

Plans are keyed by scale index, never by width. All per-call data lives in the loop's ``NextScaleState``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, FrozenSet, List, Optional, Sequence, Tuple

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.utils import PushToHubMixin

if TYPE_CHECKING:  # pragma: no cover
    from ..models.forward_context import TokenRouter
    from ..pipelines.next_scale import NextScaleState


@dataclass(frozen=True)
class ScalePlan:
    """What the loop does for one transformer pass.

    Args:
        scale_indices (`tuple[int]`): the scales decoded in this pass, consecutive and ascending. More than one means
            parallel decoding: every scale's input is interpolated from the summed latent before the pass, and the
            pass uses a block-causal attention mask (a scale sees earlier scales and itself).
        skip (`bool`, defaults to `False`): run no transformer pass and add no codes for these scales.
        cfg_halve (`bool`, defaults to `False`): under CFG, run only the conditional rows through the blocks; their
            output stands in for the unconditional rows (the guidance difference at these scales is zero).
        record_attention_layers (`frozenset[int]`): self-attention layers whose probabilities are computed
            explicitly and handed to ``after_scale``.
    """

    scale_indices: Tuple[int, ...]
    skip: bool = False
    cfg_halve: bool = False
    record_attention_layers: FrozenSet[int] = field(default_factory=frozenset)


def validate_plans(plans: Sequence[ScalePlan], num_scales: int) -> None:
    """Every scale in exactly one plan, in order; groups consecutive; nothing beyond the last scale.

    Raises:
        ValueError: naming the offending plan and what is allowed.
    """
    expected = 0
    for plan in plans:
        idx = tuple(plan.scale_indices)
        if not idx:
            raise ValueError(f"a scale plan has no scale indices: {plan}")
        if idx[-1] >= num_scales:
            raise ValueError(f"plan {idx} crosses the last scale: scale indices must be < {num_scales}")
        if idx != tuple(range(expected, expected + len(idx))):
            raise ValueError(f"plan {idx} is out of order: the next plan must start at scale {expected} and be consecutive")
        if 0 in idx and len(idx) > 1:
            raise ValueError(f"plan {idx} groups scale 0 with later scales; scale 0 (the start token) runs alone")
        expected += len(idx)
    if expected != num_scales:
        raise ValueError(f"plans cover scales 0..{expected - 1} but the schedule has {num_scales} scales")


class VARAccelScheduler(ConfigMixin, PushToHubMixin):
    """Base class of the acceleration schedulers; the default behaviour of every hook is "no acceleration".

    Subclasses override only the extension points they need and declare the model families they support.
    """

    config_name = "acceleration_config.json"
    #: Model families (``"infinity"``, ``"hart"``) this scheduler's configuration was made for.
    supported_model_families: Tuple[str, ...] = ("infinity", "hart")

    def check_model_family(self, family: str) -> None:
        """Raise if this scheduler was not built for ``family``."""
        if family not in self.supported_model_families:
            raise ValueError(
                f"{type(self).__name__} supports model families {list(self.supported_model_families)}, not {family!r}"
            )

    def plan_scales(self, scale_schedule: Sequence[Tuple[int, ...]]) -> List[ScalePlan]:
        """One plan per transformer pass; the default decodes every scale alone and in full."""
        return [ScalePlan((i,)) for i in range(len(scale_schedule))]

    def before_scale(self, state: "NextScaleState", plan: ScalePlan) -> None:
        """Hook before a pass (default: nothing)."""

    def token_router(self, state: "NextScaleState", plan: ScalePlan) -> Optional["TokenRouter"]:
        """The token router of a pass, or ``None`` to compute every token (default)."""
        return None

    def after_scale(self, state: "NextScaleState", plan: ScalePlan, hidden_states_RLC: torch.Tensor) -> None:
        """Hook after a pass and its sampling, before the next plan (default: nothing)."""


class IdentityScheduler(VARAccelScheduler):
    """No acceleration: the baseline is the same loop run with this scheduler."""

    @register_to_config
    def __init__(self):
        super().__init__()
