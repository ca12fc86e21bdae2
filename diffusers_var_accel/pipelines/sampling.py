"""Token sampling shared by the next-scale pipelines: top-k / top-p masks and categorical draws from the call's
generator(s), in the official order or without host syncs (``pipe.set_sampling``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Tuple, Union

import torch


GeneratorArg = Union[None, torch.Generator, Sequence[torch.Generator]]


def mask_top_k_top_p(logits_BNV: torch.Tensor, top_k: Optional[int], top_p: Optional[float]) -> torch.Tensor:
    """A float copy of the logits with everything outside the top-k (ties kept; k is clamped to V) and outside the
    top-p nucleus (the low-probability tail whose mass is <= 1 - top_p) set to -inf. 0 / None disable either."""
    logits = logits_BNV.float()
    if logits is logits_BNV:  # already fp32: copy, the masks below write in place; a cast is a new tensor already
        logits = logits.clone()
    V = logits.shape[-1]
    k = min(int(top_k), V) if top_k and top_k > 0 else V
    if k < V:  # k = V keeps every logit (the k-th largest is the smallest): nothing to mask
        kth = logits.topk(k, dim=-1, largest=True, sorted=False)[0].amin(dim=-1, keepdim=True)
        logits.masked_fill_(logits < kth, float("-inf"))
    if top_p is not None and top_p > 0:
        if V == 2 and top_p > 0.5:
            # Two classes (Infinity's bits): the nucleus drops the smaller one when its probability is <= 1 - top_p.
            # With 1 - top_p < 1/2 only the strictly smaller class can qualify, and its cumulative mass in ascending
            # order is its own probability (a softmax over two values does not depend on their order), so the
            # sort / cumsum / scatter of the general case gives exactly this mask.
            logits.masked_fill_(logits.softmax(dim=-1) <= (1 - top_p), float("-inf"))
        else:
            sorted_logits, sorted_idx = logits.sort(dim=-1, descending=False)
            remove_sorted = sorted_logits.softmax(dim=-1).cumsum_(dim=-1) <= (1 - top_p)
            remove_sorted[..., -1:] = False
            logits.masked_fill_(remove_sorted.scatter(-1, sorted_idx, remove_sorted), float("-inf"))
    return logits


#: The sampling modes of the pipelines (``pipe.set_sampling``).
SAMPLING_MODES = ("device", "official")


def check_sampling_mode(mode: Any) -> str:
    """``mode`` must be one of :data:`SAMPLING_MODES`."""
    if not isinstance(mode, str) or mode not in SAMPLING_MODES:
        raise ValueError(f"sampling must be one of {list(SAMPLING_MODES)}, got {mode!r}")
    return mode


@dataclass
class DrawCheck:
    """The check ``torch.multinomial`` makes on the host, for the device draws of one call, made once after the loop.

    ``multinomial`` refuses probabilities with ``inf``, ``nan`` or an entry ``< 0``, and rows of zero mass; after the
    softmax only a row of NaN can occur (a NaN or ``+inf`` logit, or a row masked entirely to ``-inf``), and a row of
    zeros only when probabilities are given directly. The exponential race keeps each row's winning value
    ``max(p / q)``: NaN for a NaN row, 0 for a zero row, positive otherwise. Each draw adds the smallest of its
    winners (one reduction on the device, no sync); :meth:`raise_if_invalid` reads them all in one host copy.
    Per call: the family object of the call owns it, and it is gone when the call returns.
    """

    minima: List[torch.Tensor] = field(default_factory=list)
    scale_indices: List[int] = field(default_factory=list)

    def record(self, winners: torch.Tensor, scale_index: int) -> None:
        """Add the smallest winning value of one draw at ``scale_index``."""
        self.minima.append(winners.amin().reshape(1))
        self.scale_indices.append(scale_index)

    def raise_if_invalid(self) -> None:
        """Raise ``RuntimeError`` like ``multinomial`` when a draw had a row of NaN or zero mass, naming its scale.

        One host copy of every draw's minimum (the call's one sync for it); nothing when no draw ran on the device.
        """
        if not self.minima:
            return
        minima = torch.cat(self.minima).tolist()
        self.minima, scale_indices, self.scale_indices = [], self.scale_indices, []
        for value, scale_index in zip(minima, scale_indices):
            if not value > 0:  # NaN compares false
                kind = "contains `nan`" if value != value else "has a row of zero mass (sum of probabilities <= 0)"
                raise RuntimeError(
                    f"invalid multinomial distribution at scale {scale_index}: the probability tensor {kind} "
                    f"(sampling='device' found it after the loop; sampling='official' raises at the draw, as "
                    f"torch.multinomial does)"
                )


def sample_categorical(
    masked_logits_BNV: torch.Tensor,
    generator: GeneratorArg,
    mode: str = "device",
    check: Optional[DrawCheck] = None,
    scale_index: int = -1,
) -> torch.Tensor:
    """One draw from each of the ``B * N`` distributions of the (masked) logits: ``(B, N)`` int64.

    One generator draws all of the batch at once (the official draws), a list of generators one image each (an image
    then does not depend on its batch). Draws run on the generator's device.

    ``mode="official"`` calls ``torch.multinomial(probs, 1)``; ``mode="device"`` draws the same exponential race
    ``argmax(probs / Exp(1))`` that ``multinomial`` computes for one sample, without its host-side checks of the
    probabilities (a device-to-host sync per call on CUDA). Both consume the generator identically and give the same
    tokens on the CPU (``tests/test_sampling.py``). In device mode, ``check`` (a :class:`DrawCheck`) receives the
    smallest winning value of the draw, tagged with ``scale_index``, so that the call can raise once after its loop
    where ``multinomial`` would have raised at the draw; without it, a row of NaN gives an arbitrary token.
    """
    B, N, V = masked_logits_BNV.shape
    probs = masked_logits_BNV.softmax(dim=-1)
    draw = _multinomial if check_sampling_mode(mode) == "official" else _exponential_race
    if isinstance(generator, (list, tuple)):
        drawn = [draw(probs[b].view(-1, V), generator[b]) for b in range(B)]
        tokens = torch.stack([indices.view(N) for indices, _ in drawn])
        winners = [w for _, w in drawn if w is not None]
    else:
        indices, winner = draw(probs.view(-1, V), generator)
        tokens, winners = indices.view(B, N), [winner] if winner is not None else []
    if check is not None:
        for winner in winners:
            check.record(winner, scale_index)
    return tokens


def _multinomial(probs_NV: torch.Tensor, generator: Optional[torch.Generator]) -> Tuple[torch.Tensor, None]:
    device = generator.device if generator is not None else probs_NV.device
    out = torch.multinomial(probs_NV.to(device), num_samples=1, replacement=True, generator=generator)
    return out.to(probs_NV.device), None  # multinomial checks its input itself


def _exponential_race(
    probs_NV: torch.Tensor, generator: Optional[torch.Generator]
) -> Tuple[torch.Tensor, torch.Tensor]:
    # the one-sample branch of torch.multinomial: q ~ Exp(1) of the probabilities' shape, argmax(p / q); max gives
    # the winning values with the indices in the same kernel (the indices are argmax's, first of ties and NaN)
    device = generator.device if generator is not None else probs_NV.device
    probs = probs_NV.to(device)
    race = probs.div(torch.empty_like(probs).exponential_(generator=generator))
    winners, indices = race.max(dim=-1, keepdim=True)
    return indices.to(probs_NV.device), winners


# ---------------------------------------------------------------------------------------------------------------------
# input validation shared by the pipelines: each helper names the argument, the bad value and what is allowed
