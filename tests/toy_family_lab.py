"""The toy family's lab side (tests only): its FLOP breakdown (:data:`TOY_FLOPS`: which step counts for which part),
its counter and its lab record; :func:`registered` registers it with the library family (``toy_family.py``)."""

from __future__ import annotations

import contextlib
import re
from typing import Any, Dict

import torch

from diffusers_var_accel.lab.bench.flop_meter import FamilyFlops, GenerationRun, count_generation_flops, sublayer_flops
from diffusers_var_accel.lab.families import LabFamily, register_lab_family, unregister_lab_family
from diffusers_var_accel.next_scale import run_next_scale_loop

import toy_family
from toy_family import TEXT_BYTES, TOY, ToyScaleFamily, ToyTransformer, build_tiny_toy_pipeline

_BLOCK_MODULE = re.compile(r"(?:^|\.)blocks\.\d+\.(attn|ffn)(?:\.(\w+))?$")


def toy_generation(transformer, vae, cfg: bool = True, batch_size: int = 1, scheduler=None) -> GenerationRun:
    """One ToyVAR generation for the meter: null prompts, teacher tokens (all 0) instead of sampling."""
    family = ToyScaleFamily(transformer, vae, top_k=1)
    B, n = batch_size, len(family.patch_nums)

    def encode():
        ids = torch.zeros(B, TEXT_BYTES, dtype=torch.long)
        return transformer.encode_condition(ids, unconditional_rows=B if cfg else 0)

    def loop(condition, on_scale_end):
        teacher = [torch.zeros(B, pn * pn, dtype=torch.long) for pn in family.patch_nums]
        guidance = [3.0 if cfg else 1.0] * n
        return run_next_scale_loop(
            family, condition, family.scale_schedule, B, guidance, [1.0] * n, None, scheduler, teacher, on_scale_end
        )

    return GenerationRun(
        steps=family,
        encode=encode,
        loop=loop,
        decode=lambda state: vae.decode(state.f_hat),
        rows=2 * B if cfg else B,
        scales=[dict(h=pn, w=pn, tokens=pn * pn) for pn in family.patch_nums],
        kv_tokens=[pn * pn for pn in family.patch_nums],
    )


def _toy_sublayers(flop_counts) -> Dict[str, int]:
    per = sublayer_flops(flop_counts, _BLOCK_MODULE)
    return {"self_attn": sum(per[("attn", None)].values()), "ffn": sum(per[("ffn", None)].values())}


def _toy_cli(args, methods) -> int:
    raise ValueError("ToyVAR has no command-line FLOP report (a test-only family)")


#: The toy's FLOP breakdown: which step counts for which part (the registry's ``flop_breakdown``).
TOY_FLOPS = FamilyFlops(
    models=("toyvar-tiny",),
    transformer_class=ToyTransformer,
    prepare=toy_generation,
    step_parts={"start": "embed", "embed": "embed", "run_blocks": "blocks", "predict": "head", "add_codes": "codes"},
    scale_fields=(("blocks", ("blocks",)), ("head", ("head",)), ("embed", ("embed",))),
    loop_totals=(("transformer", "flops"),),
    sublayers=_toy_sublayers,
    breakdown_fields=("head", "embed"),
    summary=lambda r: {"total_tflops": r["total_flops"] / 1e12},
    published=lambda baseline: {},
    run_cli=_toy_cli,
)


def count_toy_flops(model_name: str = "toyvar-tiny", accel=None, **options) -> Dict[str, Any]:
    """The toy's FLOP counter (the registry's ``flop_counter``): one generation of the tiny model."""
    pipe = build_tiny_toy_pipeline()
    return count_generation_flops(pipe.transformer, pipe.vae, scheduler=accel, **options)


TOY_LAB_FAMILY = LabFamily(
    TOY,
    flop_counter="toy_family_lab:count_toy_flops",
    flop_breakdown="toy_family_lab:TOY_FLOPS",
    title="ToyVAR",
    description="a toy next-scale model (tests only)",
)


@contextlib.contextmanager
def registered():
    """The toy family and its lab record registered for the duration of the block."""
    with toy_family.registered() as family:
        register_lab_family(TOY_LAB_FAMILY)
        try:
            yield family
        finally:
            unregister_lab_family(TOY)
