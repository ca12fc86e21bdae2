"""Token sampling shared by the next-scale pipelines: top-k / top-p masks and categorical draws from the call's
generator(s), in the official order or without host syncs (``pipe.set_sampling``)."""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

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


def sample_categorical(masked_logits_BNV: torch.Tensor, generator: GeneratorArg, mode: str = "device") -> torch.Tensor:
    """One draw from each of the ``B * N`` distributions of the (masked) logits: ``(B, N)`` int64.

    One generator draws all of the batch at once (the official draws), a list of generators one image each (an image
    then does not depend on its batch). Draws run on the generator's device.

    ``mode="official"`` calls ``torch.multinomial(probs, 1)``; ``mode="device"`` draws the same exponential race
    ``argmax(probs / Exp(1))`` that ``multinomial`` computes for one sample, without its host-side checks of the
    probabilities (a device-to-host sync per call on CUDA). Both consume the generator identically and give the same
    tokens on the CPU (``tests/test_sampling.py``).
    """
    B, N, V = masked_logits_BNV.shape
    probs = masked_logits_BNV.softmax(dim=-1)
    draw = _multinomial if check_sampling_mode(mode) == "official" else _exponential_race
    if isinstance(generator, (list, tuple)):
        return torch.stack([draw(probs[b].view(-1, V), generator[b]).view(N) for b in range(B)])
    return draw(probs.view(-1, V), generator).view(B, N)


def _multinomial(probs_NV: torch.Tensor, generator: Optional[torch.Generator]) -> torch.Tensor:
    device = generator.device if generator is not None else probs_NV.device
    out = torch.multinomial(probs_NV.to(device), num_samples=1, replacement=True, generator=generator)
    return out.to(probs_NV.device)


def _exponential_race(probs_NV: torch.Tensor, generator: Optional[torch.Generator]) -> torch.Tensor:
    # the one-sample branch of torch.multinomial: q ~ Exp(1) of the probabilities' shape, argmax(p / q)
    device = generator.device if generator is not None else probs_NV.device
    probs = probs_NV.to(device)
    race = probs.div(torch.empty_like(probs).exponential_(generator=generator))
    return race.argmax(dim=-1, keepdim=True).to(probs_NV.device)


# ---------------------------------------------------------------------------------------------------------------------
# input validation shared by the pipelines: each helper names the argument, the bad value and what is allowed
