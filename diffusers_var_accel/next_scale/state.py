"""The per-call state of the next-scale loop and what the loop needs from a model family.

Everything here lives for one call and is dropped when it returns: the KV cache, the summed latent, tokens and
logits per scale, what passes recorded and each acceleration method's own typed per-call state.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Hashable, Optional, Sequence, Tuple, TypeVar

import torch

from .cache import ScaleKVCache
from .context import PassRecords, VARForwardContext
from .plan import ModelInfo, ScalePlan
from .rows import RowLayout

CallStateT = TypeVar("CallStateT")


class ScaleModelFamily:
    """What the loop needs from one model family (Infinity, HART): six steps of the official sampler.

    One object per call (it may hold the call's sampling options and per-call tables). Shape legend: ``B`` images,
    ``R`` rows of the pass (``2B`` under CFG), ``L`` tokens, ``C`` width, ``d`` latent channels.

    Attributes:
        family (`str`): the registered family name (:mod:`diffusers_var_accel.families`): schedulers are checked
            against it and the loop reads the family's "no guidance" value from the registry.
        num_layers (`int`): transformer blocks.
        num_start_tokens (`int`): tokens per row that :meth:`start` gives (the KV cache is sized from it). Scale 0 is
            predicted from the outputs of the *last* ``h0 * w0`` start tokens (Infinity: its one start token; HART:
            the last of its context tokens).
    """

    family: str = ""
    num_layers: int = 0
    num_start_tokens: int = 1

    def start(self, condition) -> torch.Tensor:
        """The embedded start tokens ``(R, num_start_tokens, C)`` for the rows of ``condition``."""
        raise NotImplementedError

    def embed(
        self,
        f_hat: Optional[torch.Tensor],
        scale_indices: Sequence[int],
        condition,
        scale_index_L: Optional[torch.Tensor],
    ) -> Tuple[Optional[torch.Tensor], torch.Tensor]:
        """The inputs of one pass with their positions.

        Returns ``(x_BLC, rope)``: the embedded inputs ``(B, L, C)`` of the scales of ``scale_indices`` other than 0,
        interpolated from ``f_hat`` and concatenated in order (``None`` when the pass is scale 0 alone), and the
        positional tables of every token of ``scale_indices`` (scale 0's start tokens first) for the rows of
        ``condition``. ``scale_index_L`` is the scale index of every token of ``x_BLC`` (``None`` with it).
        """
        raise NotImplementedError

    def run_blocks(self, hidden_RLC: torch.Tensor, condition, context: VARForwardContext) -> torch.Tensor:
        """The transformer blocks of one pass (through the executor). Reads the call's tensors from its arguments only
        (never from the family's own attributes): a captured pass (:class:`~.graphs.PassGraphs`) treats the arguments
        as its inputs."""
        raise NotImplementedError

    def predict(
        self,
        hidden_RLC: torch.Tensor,
        condition,
        scale_index: int,
        *,
        batch_size: int,
        guidance: float,
        temperature: float,
        generator,
        residual_tokens: Optional[torch.Tensor] = None,
        tokens: Optional[torch.Tensor] = None,
    ) -> "ScalePrediction":
        """One scale's tokens and codes from the last block's output ``hidden_RLC`` (every row of the pass).

        Guidance (``guidance`` in the family's own convention; the registry's ``no_guidance`` value means none, and
        then only the first ``batch_size`` rows are read), temperature, sampling from ``generator`` (skipped when
        teacher ``tokens`` are given) and the family's code mixture or refinement head. ``residual_tokens`` ``(B, n)``:
        the only positions of this scale that get a residual (the loop zeroes the others' codes); a family that refines
        codes with another head runs it only there (:func:`~.executor.on_computed_tokens`).
        """
        raise NotImplementedError

    def add_codes(self, f_hat: Optional[torch.Tensor], codes: torch.Tensor, scale_index: int) -> torch.Tensor:
        """The tokenizer's ``f_hat`` update with one scale's codes ``(B, d, h, w)`` (each tokenizer owns it, as VAR's
        quantiser does)."""
        raise NotImplementedError

    def select_rows(self, condition, rows: slice):
        """The condition of a subset of rows (a pass that runs one CFG half)."""
        raise NotImplementedError


@dataclass
class ScalePrediction:
    """What :meth:`ScaleModelFamily.predict` gives for one scale.

    Args:
        tokens: the sampled (or teacher) tokens, ``(B, L)`` or ``(B, L, bits)``.
        codes: their latent codes ``(B, d, h, w)`` on the token grid, before the plan's residual mask and code weights.
        logits: the head's raw output (every row it ran on), kept in :attr:`NextScaleState.logits`.
    """

    tokens: torch.Tensor
    codes: torch.Tensor
    logits: torch.Tensor


def concat_scale_inputs(inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """The inputs of a pass's scales joined along the tokens: one contiguous input is its own concatenation (no copy)."""
    return inputs[0] if len(inputs) == 1 and inputs[0].is_contiguous() else torch.cat(list(inputs), dim=1)


def schedule_slice(
    table: torch.Tensor, offsets: Sequence[int], scale_indices: Sequence[int], dim: int
) -> torch.Tensor:
    """The entries of ``scale_indices`` in a per-call table over every token of the schedule (scale ``k`` holds
    positions ``offsets[k]:offsets[k + 1]`` along ``dim``): a view for consecutive scales, a concatenation otherwise."""
    scale_indices = list(scale_indices)
    index = [slice(None)] * dim
    if scale_indices == list(range(scale_indices[0], scale_indices[-1] + 1)):
        return table[(*index, slice(offsets[scale_indices[0]], offsets[scale_indices[-1] + 1]))]
    return torch.cat([table[(*index, slice(offsets[k], offsets[k + 1]))] for k in scale_indices], dim=dim)


class ScheduleTables:
    """Constant tables that depend only on a schedule, the model's structure and the device (scale ids, position
    tables), kept for the schedules of recent calls, least recently used first.

    The one cache of the next-scale runtime that outlives a call, and it has an explicit owner: a pipeline keeps one
    (``pipe.schedule_tables``) and hands it to every call; the loop makes a fresh one, dropped with the call, when it
    is given none. Its tables are never written to, so calls with the same schedule share them.

    Args:
        max_entries (`int`, defaults to 256): how many tables are kept (small index and position tables: a few MB
            at most each; a method may keep a few per scale, as DepthVAR's rank-space depth plans on the device).
    """

    def __init__(self, max_entries: int = 256):
        if not isinstance(max_entries, int) or isinstance(max_entries, bool) or max_entries < 1:
            raise ValueError(f"max_entries must be a positive integer, got {max_entries!r}")
        self.max_entries = max_entries
        self._tables: "OrderedDict[Hashable, Any]" = OrderedDict()

    def get(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """The table stored under ``key``, built by ``build()`` the first time."""
        if key in self._tables:
            self._tables.move_to_end(key)
            return self._tables[key]
        value = self._tables[key] = build()
        while len(self._tables) > self.max_entries:
            self._tables.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._tables)

    def clear(self) -> None:
        """Drop every table (they are rebuilt on the next call that needs them)."""
        self._tables.clear()


@dataclass
class NextScaleState:
    """Everything that lives for one call of the loop; dropped when the call returns.

    Schedulers read it in their hooks; each keeps its own per-call data in a typed object (``call_state``).
    """

    scale_schedule: Tuple[Tuple[int, ...], ...]
    batch_size: int
    rows: int
    kv_cache: ScaleKVCache
    f_hat: Optional[torch.Tensor] = None
    tokens: Dict[int, torch.Tensor] = field(default_factory=dict)
    logits: Dict[int, torch.Tensor] = field(default_factory=dict)
    records: PassRecords = field(default_factory=PassRecords)
    scale_index: int = 0
    model: Optional[ModelInfo] = None
    layout: Optional[RowLayout] = None
    plans: Tuple[ScalePlan, ...] = ()
    pass_index: int = 0
    method_states: Dict[int, Any] = field(default_factory=dict)
    #: the call's token generator(s) (one, or one per image), as the loop was given them; methods that draw their own
    #: randomness derive their seeds from it, never consume it
    generator: Any = None
    #: per-call constants shared by every pass (``VARForwardContext.call_cache``): models and the loop fill it lazily,
    #: keyed by ``(name, layer_idx)``; gone when the call returns
    call_cache: Dict[Any, Any] = field(default_factory=dict)
    #: the constant tables shared with other calls of the same schedule (:class:`ScheduleTables`, owned by the caller)
    tables: ScheduleTables = field(default_factory=ScheduleTables)
    #: what each pass computed, as the executor ran it (:class:`~.work.CallWork`; the pipelines' summary)
    work: Optional[Any] = None

    @property
    def num_scales(self) -> int:
        return len(self.scale_schedule)

    @property
    def attention_maps(self) -> Dict[int, torch.Tensor]:
        """The self-attention maps the last pass recorded (``records.attention``)."""
        return self.records.attention

    def call_state(self, owner: Any, factory: Callable[[], CallStateT]) -> CallStateT:
        """``owner``'s per-call object (made by ``factory`` on first use); gone when the call returns."""
        key = id(owner)
        if key not in self.method_states:
            self.method_states[key] = factory()
        return self.method_states[key]

    def next_plan(self) -> Optional[ScalePlan]:
        """The plan after the current pass, or ``None`` after the last."""
        return self.plans[self.pass_index + 1] if self.pass_index + 1 < len(self.plans) else None

    def previous_plan(self) -> Optional[ScalePlan]:
        """The plan of the pass before the current one, or ``None`` for the first."""
        return self.plans[self.pass_index - 1] if self.pass_index > 0 else None
