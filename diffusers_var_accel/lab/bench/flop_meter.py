"""The FLOP meter of every model family: counted on the real code path, on meta tensors, without any weight.

A family's models are built on the ``meta`` device from their real configurations and driven exactly as its pipeline
drives them: text conditioning, :func:`~diffusers_var_accel.next_scale.run_next_scale_loop` with the family's steps
(teacher tokens replace the sampling, the only step that needs values), then the decoder.
``torch.utils.flop_counter.FlopCounterMode`` counts every matmul, linear, convolution and attention kernel by its
shape; on meta tensors scaled-dot-product attention decomposes into ``bmm`` and is counted too.

What is the family's lives in its own ``pipelines/<family>/flops.py``, registered as ``ModelFamily.flop_breakdown``
(a :class:`FamilyFlops`): its named models, how a generation is driven (:class:`GenerationRun`), **which of its steps
count towards which reported part** (``step_parts``: data), the sublayer split of its blocks, its report and its
command-line path. The meter here wraps the steps named in ``step_parts`` (:func:`meter_steps`), records every scale
(:func:`meter_generation`), and counts the self-attention conventions through the attention processors' public hook
``key_value_source`` (:func:`attend_to_current_pass`). The command line and the public API are
:mod:`diffusers_var_accel.lab.bench.flops` (this module sits in ``pipelines`` so that the families' files may use it).
"""

from __future__ import annotations

import argparse
import copy
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Pattern, Sequence, Tuple

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from diffusers_var_accel.lab.families import lab_families

_ATTENTION_OPS = ("bmm", "baddbmm", "scaled_dot_product", "flash_attention", "efficient_attention")
_TERA = 1e12
#: The loop's FLOPs at a scale that no step of ``FamilyFlops.step_parts`` ran (e.g. a scheduler's own work).
UNATTRIBUTED = "unattributed"


# ---------------------------------------------------------------------------------------------------------------------
# counter and model construction
# ---------------------------------------------------------------------------------------------------------------------
def _cpu_flash_sdpa_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """CPU SDPA has no formula in torch: count it like the CUDA kernels (QK^T and PV, 2 FLOPs per MAC)."""
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def make_flop_counter() -> FlopCounterMode:
    """A silent ``FlopCounterMode`` that also counts CPU SDPA (on meta tensors SDPA is already counted as ``bmm``)."""
    mapping = {}
    if hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"):
        mapping[torch.ops.aten._scaled_dot_product_flash_attention_for_cpu] = _cpu_flash_sdpa_flop
    return FlopCounterMode(display=False, custom_mapping=mapping)


def build_on_meta(cls, **config) -> torch.nn.Module:
    """``cls(**config)`` with every parameter and buffer on the meta device (nothing is allocated).

    ``InfinityTransformer.__init__`` calls ``.item()`` on a freshly built tensor, which fails under
    ``with torch.device("meta")``; so parameters are moved to meta as they are registered (accelerate's
    ``init_empty_weights``) and the few small buffers afterwards.
    """
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):
        model = cls(**config)
    return model.to("meta").eval()


def is_attention_op(op) -> bool:
    """Whether a counted op is an attention kernel (QK^T / PV: ``bmm``, SDPA and its kernels)."""
    name = str(op)
    return any(key in name for key in _ATTENTION_OPS)


class FlopMeter:
    """Reads the running totals of a ``FlopCounterMode``: all FLOPs, and the attention-kernel part."""

    def __init__(self, mode: FlopCounterMode):
        self.mode = mode

    def read(self) -> Tuple[int, int]:
        ops = self.mode.get_flop_counts().get("Global", {})
        return sum(ops.values()), sum(v for op, v in ops.items() if is_attention_op(op))


def sublayer_flops(
    flop_counts: Dict[str, Dict[Any, int]], pattern: Pattern
) -> Dict[Tuple[str, Optional[str]], Dict[str, int]]:
    """FLOPs of the blocks' sublayers, summed over blocks, from the counter's per-module table.

    ``pattern`` matches a block sublayer's module name with group 1 the sublayer (``"sa"``) and group 2 an optional
    child (``"proj"``); returns ``{(sublayer, child or None): {"linear": ..., "attention": ...}}`` (a module's table
    includes its children's, so ``(sublayer, None)`` is the whole sublayer). A family's ``sublayers`` names the parts.
    """
    per = defaultdict(lambda: defaultdict(int))
    for name, ops in flop_counts.items():
        m = pattern.search(name)
        if m is None:
            continue
        for op, v in ops.items():
            per[(m.group(1), m.group(2))]["attention" if is_attention_op(op) else "linear"] += v
    return per


# ---------------------------------------------------------------------------------------------------------------------
# self-attention counting conventions (through the processors' public hook)
# ---------------------------------------------------------------------------------------------------------------------
class CurrentPassKV:
    """A KV cache seen by one self-attention call: it stores as usual but hands back only this pass's keys, plus the
    first ``prefix`` cached keys (HART's text context, say; 0: none)."""

    def __init__(self, cache, prefix: int = 0):
        self.cache = cache
        self.prefix = prefix

    def update(self, key_RHLc, value_RHLc, layer_idx, cache_rows=None, row_start=0):
        k_all, v_all = self.cache.update(key_RHLc, value_RHLc, layer_idx, cache_rows=cache_rows, row_start=row_start)
        keep = min(self.prefix, k_all.shape[-2] - key_RHLc.shape[-2])  # of the keys cached by earlier passes
        if keep == 0:
            return key_RHLc, value_RHLc
        return (
            torch.cat((k_all[..., :keep, :], key_RHLc), dim=-2),
            torch.cat((v_all[..., :keep, :], value_RHLc), dim=-2),
        )

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return min(self.prefix, self.cache.get_seq_length(layer_idx)) if self.prefix else 0


def attend_to_current_pass(transformer: torch.nn.Module, keep_prefix: int = 0) -> None:
    """Counting convention only: self-attention attends to the keys of the current pass, not to the cached prefix.

    Sets the public hook ``key_value_source``
    (:class:`~diffusers_var_accel.models.attention_processor.VARAttnProcessor`) on a copy of every attention module's
    processor. The KV cache is still filled (so every later pass sees the same shapes as the real run), but each query attends only to the keys computed in its own pass: the ``h x w`` tokens of
    a dense scale, the kept tokens of a pruned scale, the kept tokens of all scales of a grouped pass (dense ``L x L``:
    the counter ignores masks anyway). With ``keep_prefix=n`` the first ``n`` cached keys stay visible too (HART: its
    300 text-context tokens). The output shape is unchanged. This is not a valid model; it reproduces a FLOPs count
    that leaves the cross-scale attention out. Cross-attention never reads the hook.
    """
    for module in transformer.modules():
        processor = getattr(module, "processor", None)
        if processor is not None and hasattr(processor, "key_value_source"):
            processor = copy.copy(processor)
            processor.key_value_source = lambda cache: CurrentPassKV(cache, keep_prefix)
            module.set_processor(processor)


# ---------------------------------------------------------------------------------------------------------------------
# what a family declares
# ---------------------------------------------------------------------------------------------------------------------
@dataclass
class GenerationRun:
    """One generation as the family's pipeline drives it, ready for the meter (made by ``FamilyFlops.prepare``).

    Args:
        steps: the family object the loop drives; the meter wraps its steps named in ``FamilyFlops.step_parts``.
        encode: the text conditioning, ``() -> condition`` (counted as ``text_flops``).
        loop: ``(condition, on_scale_end) -> state``: :func:`run_next_scale_loop` on ``steps``.
        decode: ``(state) -> images``: the decoder (counted as ``vae_flops``).
        rows: the rows the blocks run on (``2B`` under guidance).
        scales: per scale, the leading fields of its record (``h``, ``w``, ``tokens`` ...).
        kv_tokens: per scale, the keys its pass adds to the cache (the record's running ``kv_tokens``).
    """

    steps: Any
    encode: Callable[[], Any]
    loop: Callable[[Any, Callable], Any]
    decode: Callable[[Any], Any]
    rows: int
    scales: Sequence[Dict[str, int]]
    kv_tokens: Sequence[int]


@dataclass(frozen=True)
class FamilyFlops:
    """A family's part of the FLOP meter (its ``ModelFamily.flop_breakdown``): one declaration per family.

    Args:
        models: the named models its counter (``ModelFamily.flop_counter``) knows: the CLI's ``--model`` choices.
        transformer_class: the family's transformer (:func:`count_generation_flops` finds the family by it).
        prepare: ``(transformer, vae, *args, **options) -> GenerationRun``: the family's generation.
        step_parts: ``{step name: part}``: the FLOPs of each step go to that part of the current scale (a step run
            inside another is attributed to the innermost one); loop FLOPs outside every step go to
            :data:`UNATTRIBUTED`.
        scale_fields: ``((field, parts), ...)``: each scale's record gets ``<field>_flops`` = the sum of those parts.
        loop_totals: ``((total, scale field), ...)``: the result's ``<total>_flops`` = the sum over scales of that
            field of the record (``"flops"``: everything the loop counted at a scale).
        sublayers: ``flop_counts -> {name: FLOPs}``: the blocks split by sublayer (:func:`sublayer_flops`).
        breakdown_fields: scale fields summed into ``transformer_breakdown`` after the sublayers.
        summary: ``result -> {key: TFLOPs}``: the columns of :func:`compare_methods`' summary rows.
        published: ``baseline result -> {method: TFLOPs}``: papers' totals of the methods at that setting.
        run_cli: ``(args, methods) -> exit status``: the family's path of :func:`main` (checks, counts, prints).
        cli_help: the family's phrase in the help of the shared options ``"size"`` (``--height`` / ``--width``) and
            ``"text_tokens"``.
        text_encoder: ``(name, help)`` of its ``--<name>-tokens`` option (its text encoder counted beside the total).
        conventions: whether ``run_cli`` reads ``--conventions``.
    """

    models: Tuple[str, ...]
    transformer_class: type
    prepare: Callable[..., GenerationRun]
    step_parts: Mapping[str, str]
    scale_fields: Tuple[Tuple[str, Tuple[str, ...]], ...]
    loop_totals: Tuple[Tuple[str, str], ...]
    sublayers: Callable[[Dict[str, Dict[Any, int]]], Dict[str, int]]
    breakdown_fields: Tuple[str, ...]
    summary: Callable[[Dict[str, Any]], Dict[str, float]]
    published: Callable[[Dict[str, Any]], Dict[str, float]]
    run_cli: Callable[[argparse.Namespace, List[str]], int]
    cli_help: Mapping[str, str] = field(default_factory=dict)
    text_encoder: Optional[Tuple[str, str]] = None
    conventions: bool = False


def family_flops() -> Dict[str, FamilyFlops]:
    """``{family name: FamilyFlops}`` of the registered families that declare one, in registration order."""
    return {family.name: family.flop_breakdown_spec() for family in lab_families() if family.flop_breakdown}


def flops_of_model(model_name: str) -> FamilyFlops:
    """The :class:`FamilyFlops` whose family has the named model, or a ``ValueError`` listing the known models."""
    for spec in family_flops().values():
        if model_name in spec.models:
            return spec
    raise ValueError(f"unknown model {model_name!r}; choose one of {model_choices()}")


def model_choices() -> List[str]:
    return [m for spec in family_flops().values() for m in sorted(spec.models)]


# ---------------------------------------------------------------------------------------------------------------------
# the meter
# ---------------------------------------------------------------------------------------------------------------------
def meter_steps(steps: Any, step_parts: Mapping[str, str], meter: FlopMeter) -> Dict[str, int]:
    """Wrap ``steps``' methods named in ``step_parts`` (on the instance: calls between steps are wrapped too) so that
    the FLOPs of each call go to its part; returns the ``{part: FLOPs}`` they add to (the caller reads and clears it).

    A step run inside another step is attributed to the innermost one (the outer one gets its own FLOPs only)."""
    parts: Dict[str, int] = defaultdict(int)
    nested: List[int] = []

    def metered(step: Callable, part: str) -> Callable:
        def run(*args, **kwargs):
            before, _ = meter.read()
            nested.append(0)
            try:
                out = step(*args, **kwargs)
            finally:
                inner = nested.pop()
            spent = meter.read()[0] - before
            parts[part] += spent - inner
            if nested:
                nested[-1] += spent
            return out

        return run

    for name, part in step_parts.items():
        setattr(steps, name, metered(getattr(steps, name), part))
    return parts


def _family_of(transformer) -> FamilyFlops:
    for spec in family_flops().values():
        if isinstance(transformer, spec.transformer_class):
            return spec
    raise ValueError(
        f"{type(transformer).__name__} is the transformer of no registered family's FLOP breakdown; "
        f"known: {[spec.transformer_class.__name__ for spec in family_flops().values()]}"
    )


@torch.no_grad()
def count_generation_flops(transformer: torch.nn.Module, vae: torch.nn.Module, *args, **options) -> Dict[str, Any]:
    """FLOPs of one generation with these (meta or real) models, split into text conditioning, scales and decode.

    The family is the transformer's; ``args`` / ``options`` are its generation's (Infinity:
    ``count_generation_flops(transformer, vae, scale_schedule, grid_hw, cfg=True, batch_size=1, text_tokens=32,
    decode_vae=None, spatial_patchify=False, scheduler=None)``; HART: ``(transformer, vae, cfg=True, batch_size=1,
    guidance_scale=4.5, scheduler=None, use_diffusion_head=True)``). With an acceleration ``scheduler`` the loop runs
    its plans: skipped scales count 0, and a grouped pass is counted on the first scale of its group.

    Returns:
        ``dict`` with integer FLOPs: ``rows``, ``text_flops``, the family's loop totals (``transformer_flops`` ...),
        ``vae_flops``, ``total_flops``, ``attention_core_flops`` (QK^T and PV in the loop), ``per_scale`` (one dict
        per scale: scale_index, h, w, tokens, kv_tokens, flops, the family's part FLOPs, attention_flops) and
        ``transformer_breakdown`` (per sublayer kind, summed over blocks and scales, then the breakdown fields).
    """
    spec = _family_of(transformer)
    return meter_generation(spec, spec.prepare(transformer, vae, *args, **options))


@torch.no_grad()
def meter_generation(spec: FamilyFlops, run: GenerationRun) -> Dict[str, Any]:
    """Count ``run`` (see :func:`count_generation_flops`), attributing the loop's FLOPs as ``spec`` declares."""
    mode = make_flop_counter()
    meter = FlopMeter(mode)
    parts = meter_steps(run.steps, spec.step_parts, meter)
    per_scale: List[Dict[str, Any]] = []
    with mode:
        condition = run.encode()
        text_flops, _ = meter.read()
        mark = list(meter.read())
        kv_tokens = 0

        def on_scale_end(si, state):
            nonlocal kv_tokens
            total, attention = meter.read()
            kv_tokens += run.kv_tokens[si]
            spent = dict(parts)
            parts.clear()
            flops = total - mark[0]
            spent[UNATTRIBUTED] = flops - sum(spent.values())
            record = dict(scale_index=si, **run.scales[si], kv_tokens=kv_tokens, flops=flops)
            for name, members in spec.scale_fields:
                record[f"{name}_flops"] = sum(spent.get(part, 0) for part in members)
            record["attention_flops"] = attention - mark[1]
            per_scale.append(record)
            mark[:] = [total, attention]

        state = run.loop(condition, on_scale_end)
        after_loop, _ = meter.read()
        run.decode(state)
        total_flops, _ = meter.read()

    if sum(s["flops"] for s in per_scale) != after_loop - text_flops:  # pragma: no cover - loop bookkeeping guard
        raise RuntimeError("per-scale FLOPs do not add up to the loop's FLOPs")
    breakdown = spec.sublayers(mode.get_flop_counts())
    for key in spec.breakdown_fields:
        breakdown[key] = sum(s[f"{key}_flops"] for s in per_scale)
    result: Dict[str, Any] = dict(rows=run.rows, text_flops=text_flops)
    for total, scale_field in spec.loop_totals:
        result[f"{total}_flops"] = sum(s[scale_field] for s in per_scale)
    result.update(
        vae_flops=total_flops - after_loop,
        total_flops=total_flops,
        attention_core_flops=sum(s["attention_flops"] for s in per_scale),
        per_scale=per_scale,
        transformer_breakdown=breakdown,
    )
    return result


def add_tflops(result: Dict[str, Any], spec: FamilyFlops, accel: Optional[str]) -> Dict[str, Any]:
    """A named model's count: ``accel`` (or ``"baseline"``), ``*_tflops`` of every total, ``tflops`` and ``percent``
    in each ``per_scale`` entry, and ``transformer_breakdown_tflops`` in place of ``transformer_breakdown``."""
    result["accel"] = accel or "baseline"
    for key in ("text", *(total for total, _ in spec.loop_totals), "vae", "total", "attention_core"):
        result[f"{key}_tflops"] = result[f"{key}_flops"] / _TERA
    for s in result["per_scale"]:
        s["tflops"] = s["flops"] / _TERA
        s["percent"] = 100.0 * s["flops"] / result["total_flops"]
    result["transformer_breakdown_tflops"] = {k: v / _TERA for k, v in result.pop("transformer_breakdown").items()}
    return result


# ---------------------------------------------------------------------------------------------------------------------
# comparison and command line
# ---------------------------------------------------------------------------------------------------------------------
def per_scale_lines(comparison: Dict[str, Any], hw_width: int) -> List[str]:
    """The per-scale rows of a :func:`compare_methods` table: a header, then one row per scale (its ``h x w`` in
    ``hw_width`` characters, each method's TFLOPs)."""
    names = [row["method"] for row in comparison["summary"]]
    lines = [f"scale | {'h x w':>{hw_width}} | " + " | ".join(f"{n[:14]:>14}" for n in names)]
    for s in comparison["per_scale"]:
        lines.append(
            f"{s['scale_index']:>5} | {str(s['h']) + 'x' + str(s['w']):>{hw_width}} | "
            + " | ".join(f"{s[n]:>14.3f}" for n in names)
        )
    return lines


def convention_lines(
    rows: List[Dict[str, Any]],
    shown: List[str],
    label_width: int,
    paper: Optional[Dict[str, float]] = None,
    paper_label: str = "papers",
    head: str = "convention (TFLOPs, CFG, 2 FLOPs per MAC unless stated)",
) -> List[str]:
    """The text rows of a ``--conventions`` table (both families): a header, the papers' totals where ``paper`` is
    given (a method it lacks shows ``-``), then each convention's totals, ratios (baseline / method) and savings."""
    columns = lambda width, fmt: " ".join(fmt.format(m[:width]) for m in shown)  # noqa: E731
    lines = [
        f"{head:<{label_width}} {'baseline':>8} "
        + columns(10, "{:>10}")
        + "   ratios: "
        + columns(8, "{:>8}")
        + "   saved: "
        + columns(8, "{:>8}")
    ]
    if paper:
        p_tot = {m: paper.get(m.lower()) for m in shown}
        lines.append(
            f"{paper_label:<{label_width}} {paper['baseline']:>8.2f} "
            + " ".join(f"{p_tot[m]:>10.2f}" if p_tot[m] else f"{'-':>10}" for m in shown)
            + "   ratios: "
            + " ".join(f"{paper['baseline'] / p_tot[m]:>7.2f}x" if p_tot[m] else f"{'-':>8}" for m in shown)
            + "   saved: "
            + " ".join(f"{paper['baseline'] - p_tot[m]:>8.2f}" if p_tot[m] else f"{'-':>8}" for m in shown)
        )
    for row in rows:
        lines.append(
            f"{row['convention'][:label_width]:<{label_width}} {row['totals']['baseline']:>8.2f} "
            + " ".join(f"{row['totals'][m]:>10.2f}" for m in shown)
            + "   ratios: "
            + " ".join(f"{row['ratios'][m]:>7.2f}x" for m in shown)
            + "   saved: "
            + " ".join(f"{row['saved'][m]:>8.2f}" for m in shown)
        )
    return lines


def compare_methods(baseline: Dict[str, Any], accelerated: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """Baseline vs methods (counts of one named model): the family's totals, ratios (ours and the papers' where
    published) and per-scale TFLOPs."""
    spec = flops_of_model(baseline["model"])
    paper = spec.published(baseline)
    paper_base = (baseline.get("reference") or {}).get("total_tflops")

    def row(method, r, p):
        return {
            "method": method,
            **spec.summary(r),
            "ratio": baseline["total_tflops"] / r["total_tflops"],
            "paper_tflops": p,
            "paper_ratio": (paper_base / p) if (p and paper_base) else None,
        }

    summary = [dict(row("baseline", baseline, paper_base), ratio=1.0, paper_ratio=1.0 if paper_base else None)]
    for name, r in accelerated.items():
        base_name = name.split(":")[0].lower()
        summary.append(row(name, r, paper.get(base_name) if base_name == name.lower() else None))
    per_scale = [
        {
            "scale_index": s["scale_index"],
            "h": s["h"],
            "w": s["w"],
            "baseline": s["tflops"],
            **{name: r["per_scale"][i]["tflops"] for name, r in accelerated.items()},
        }
        for i, s in enumerate(baseline["per_scale"])
    ]
    return {
        "model": baseline["model"],
        "height": baseline["height"],
        "width": baseline["width"],
        "cfg": baseline["cfg"],
        "summary": summary,
        "per_scale": per_scale,
    }
