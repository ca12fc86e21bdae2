"""``var-accel generate --summary``: what acceleration did in a call, as a table, with the call's counted FLOPs.

The table is :meth:`~diffusers_var_accel.pipelines.acceleration_mixin.VARAccelerationMixin.acceleration_summary` (what
the executor recorded during the call); the FLOPs are counted by the bench's counter
(:func:`~diffusers_var_accel.lab.bench.probe.count_call_flops`) on the same call and on the same call without
acceleration.
"""

from __future__ import annotations

from typing import Any, Dict, Optional


def format_acceleration_summary(
    summary: Dict[str, Any], flops: Optional[int] = None, baseline_flops: Optional[int] = None
) -> str:
    """The summary as a text table: one line per pass, then the call's totals."""
    lines = ["pass  scales      tokens  computed (fewest/layer)  layers/token  rows run  uncond  note"]
    for index, p in enumerate(summary["passes"]):
        scales = ",".join(str(s) for s in p["scales"])
        note = "skipped" if p["skipped"] else ("grouped" if p["grouped"] else "")
        if not p["recorded"]:
            note = (note + " not counted (captured/compiled pass)").strip()
        uncond = {None: "-", True: "yes", False: "no"}[p["unconditional_ran"]]
        lines.append(
            f"{index:>4}  {scales:<10} {p['input_tokens']:>7}  {p['fewest_tokens_computed']:>23}  "
            f"{p['layers_per_token']:>12.2f}  {p['rows_run']:>3}/{p['rows']:<4}  {uncond:>6}  {note}"
        )
    base = summary["baseline_token_layers"]
    share = summary["token_layers"] / base if base else 0.0
    lines.append(f"token-layers computed: {summary['token_layers']} of {base} ({share:.1%})")
    kv = summary["kv_positions"]
    lines.append(
        f"KV positions kept per layer: {min(kv) if kv else 0}..{max(kv) if kv else 0}; "
        f"KV cache: {summary['kv_bytes'] / 2**20:.2f} MiB"
    )
    if flops is not None and baseline_flops:
        lines.append(
            f"FLOPs (counted): {flops / 1e9:.3f} G of the baseline's {baseline_flops / 1e9:.3f} G "
            f"({flops / baseline_flops:.1%}, {baseline_flops / max(flops, 1):.2f}x fewer)"
        )
    return "\n".join(lines)


def call_summary(pipe, prompt, **call: Any) -> str:
    """The table of the call just made (read first: the FLOP counts call the pipeline again), with the FLOPs of the
    same call counted with and without its per-call ``acceleration`` (``call``: the call's keywords, generator
    excluded; the pipeline has no scheduler attached, as in ``var-accel generate``)."""
    from .bench.probe import count_call_flops

    summary = pipe.acceleration_summary()
    flops = count_call_flops(pipe, prompt, **call)
    baseline = count_call_flops(pipe, prompt, **{k: v for k, v in call.items() if k != "acceleration"})
    return format_acceleration_summary(summary, flops, baseline)
