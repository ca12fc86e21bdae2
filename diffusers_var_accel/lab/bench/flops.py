"""FLOPs of one Infinity or HART text-to-image generation, counted on the real code path without allocating any weight.

The command line and the public API of the one FLOP meter (:mod:`diffusers_var_accel.lab.bench.flop_meter`), for
every registered model family. The models are built on the ``meta`` device from their real configurations and driven
exactly as the pipeline drives them: text conditioning, the next-scale loop with the family's steps (teacher tokens
replace the sampling, the only step that needs values), then the decoder. ``torch.utils.flop_counter.FlopCounterMode``
counts every matmul, linear, convolution and attention kernel by its shape; on meta tensors scaled-dot-product
attention decomposes into ``bmm`` and is counted too (checked against the analytic counts in ``tests/test_flops.py``).

What is a family's own lives in its ``pipelines/<family>/flops.py``, registered as ``ModelFamily.flop_breakdown``
(a :class:`~diffusers_var_accel.lab.bench.flop_meter.FamilyFlops`): its named models, how a generation is driven,
which of its steps count towards which reported part (data), its report, paper numbers, text-encoder formulas and its
command-line path. This module names no family: its ``--model`` choices and the family options come from the
registry, and the families' public names (``count_infinity_flops``, ``count_hart_flops``, ``format_report`` ...) are
re-exported here, so ``from diffusers_var_accel.lab.bench.flops import ...`` finds them.

Counting convention (``FlopCounterMode``'s): **FLOPs = 2 x multiply-accumulates** of matmuls, linear layers,
convolutions and attention (QK^T and PV). Element-wise work (norms, softmax, GELU, RoPE, interpolation, sampling) is
not counted (estimated below 1 % of the total). The text encoders (T5 for Infinity, Qwen2 for HART) are not part of
the total (see ``--t5-tokens`` / ``--qwen2-tokens``).

Usage (``var-accel flops`` runs :func:`main`; so does ``var-accel flops`` in a source checkout)::

    var-accel flops --model infinity-2b --height 1024 --width 1024 [--json] [--no-cfg]
                    [--text-tokens 32] [--batch-size 1] [--t5-tokens 512] [--accel fastvar lazyvar]
    var-accel flops --model infinity-2b --accel fastvar lazyvar --conventions [--json]
    var-accel flops --model hart-0.7b [--accel fastvar lazyvar depthvar arvar] [--no-cfg] [--json]
                    [--conventions] [--qwen2-tokens 450]

Importable API: :func:`count_generation_flops` (any models of a registered family, e.g. a tiny config on meta or CPU
tensors), :func:`compare_methods`, :func:`make_flop_counter`, :func:`build_on_meta`; the families' own counters of a
named model (Infinity: ``count_infinity_flops``, ``flops_components``, ``count_t5_encoder_flops``, ``format_report``,
``count_infinity_conventions``; HART: ``count_hart_flops``, ``count_hart_generation_flops``, ``hart_flops_components``,
``count_qwen2_encoder_flops``, ``format_hart_report``, ``hart_conventions``).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any, Dict, List, Optional, Sequence

from diffusers_var_accel.lab.families import lab_family, lab_families
from diffusers_var_accel.lab.bench.flop_meter import (  # noqa: F401  (the meter's public API, from here too)
    UNATTRIBUTED,
    CurrentPassKV,
    FamilyFlops,
    FlopMeter,
    GenerationRun,
    add_tflops,
    attend_to_current_pass,
    build_on_meta,
    compare_methods,
    count_generation_flops,
    flops_of_model,
    is_attention_op,
    make_flop_counter,
    meter_generation,
    meter_steps,
    sublayer_flops,
)
from diffusers_var_accel.lab.bench.flop_meter import family_flops, model_choices
from diffusers_var_accel.lab.counter_parsers import flops_parser
from diffusers_var_accel.schedulers.specs import split_acceleration_specs


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    specs = family_flops()
    titles = {name: lab_family(name).title or name for name in specs}
    parser = flops_parser(prog, models=model_choices())  # the command line parsed with it first, without torch
    with_conventions = [name for name, spec in specs.items() if spec.conventions]
    args = parser.parse_args(argv)
    methods = split_acceleration_specs(",".join(args.accel or []))
    try:
        name = next(n for n, spec in specs.items() if args.model in spec.models)
        spec = specs[name]
        # the options of other families (another text encoder, the conventions table) do not apply to this model
        foreign = {
            f"--{s.text_encoder[0]}-tokens": (getattr(args, f"{s.text_encoder[0]}_tokens"), n)
            for n, s in specs.items()
            if s.text_encoder is not None and s.text_encoder != spec.text_encoder
        }
        if not spec.conventions:
            foreign["--conventions"] = (args.conventions, with_conventions[0] if with_conventions else name)
        if any(value for value, _ in foreign.values()):
            owners = dict.fromkeys(titles[n] for _, n in foreign.values())
            verb = "apply" if len(foreign) > 1 else "applies"
            raise ValueError(f"{' and '.join(foreign)} {verb} to {' and '.join(owners)} models only")
        if not args.memory:
            return spec.run_cli(args, methods)
        return _with_counted_memory(spec, args, methods)
    except ValueError as err:
        if args.debug:
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2


def _with_counted_memory(spec: FamilyFlops, args: argparse.Namespace, methods: List[str]) -> int:
    """``--memory``: the family's output with the memory meter's counted peak of the same setting for the baseline
    and each method (``peak_bytes`` in the JSON result or comparison rows; a table below the FLOP table)."""
    import contextlib
    import io
    import json

    from .memory import MemorySettings, count_memory

    peaks = {}
    for method in ["baseline", *methods]:
        settings = dict(batch_size=args.batch_size, cfg=not args.no_cfg, text_tokens=args.text_tokens)
        settings.update({k: getattr(args, k) for k in ("height", "width") if getattr(args, k) is not None})
        accel = None if method.lower() in ("baseline", "none") else method
        peaks[method] = count_memory(MemorySettings(args.model, accel=accel, **settings))["peak_bytes"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = spec.run_cli(args, methods)
    if args.json:
        result = json.loads(out.getvalue())
        for row in result.get("summary", []):
            row["peak_bytes"] = peaks.get(row["method"])
        if "summary" not in result:
            result["peak_bytes"] = peaks["baseline"]
        print(json.dumps(result))
        return status
    print(out.getvalue(), end="")
    print("\nCounted peak device memory (var-accel memory; bf16 weights, no offload; docs/memory.md):")
    for method, peak in peaks.items():
        print(f"  {method}: {peak / 2**30:.2f} GiB")
    return status


def _family_exports() -> Dict[str, Any]:
    """The public names of the families' FLOP modules (their counters, reports and tables)."""
    names: Dict[str, Any] = {}
    for family in lab_families():
        if family.flop_breakdown:
            module = importlib.import_module(family.flop_breakdown.partition(":")[0])
            names.update({n: getattr(module, n) for n in getattr(module, "__all__", ())})
    return names


def __getattr__(name: str) -> Any:
    """The families' public FLOP names, re-exported (their modules are imported on first use, so importing this one
    stays cheap and a family registered later is found too)."""
    if name == "__all__":  # ``from diffusers_var_accel.lab.bench.flops import *`` (var-accel flops) takes them too
        own = [n for n in globals() if not n.startswith("_")]
        return own + [n for n in _family_exports() if n not in own]
    exports = _family_exports()
    if name in exports:
        return exports[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":  # python -m diffusers_var_accel.lab.bench.flops (the same as var-accel flops)
    sys.exit(main())
