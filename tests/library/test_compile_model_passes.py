"""The model side of every pass traces as one graph: ``torch.compile(transformer.forward, fullgraph=True)`` over the
blocks, the executor's routes and attention (grouped passes included, scale by scale), with the per-call constants
and the preallocated KV cache, and a second generation of the same shapes compiles nothing new.

The loop-level test (every pass of every method, sampling included) is ``test_compile_passes.py``; this one checks
the model files on LazyVAR's generations: dense passes, then a routed, grouped one."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from diffusers_var_accel import HART_CONFIGS, LazyVARScheduler, supported_sizes
from diffusers_var_accel.pipelines.hart.tiny import build_tiny_hart_pipeline
from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline

HART_PATCH_NUMS = HART_CONFIGS["hart-0.7b"]["patch_nums"][:10]
INFINITY_SIZE = sorted(hw for hw, (_, budget) in supported_sizes().items() if budget == "0.06M")[0]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    # one graph per pass (its shapes differ from every other pass's): HART's 10 scales exceed the default limit of 8
    with torch._dynamo.config.patch(recompile_limit=64):
        yield
    torch._dynamo.reset()


def _pipe(family):
    if family == "infinity":
        pipe = build_tiny_infinity_pipeline(seed=0, depth=2)
    else:
        pipe = build_tiny_hart_pipeline(
            seed=0, depth=2, embed_dim=32, patch_nums=HART_PATCH_NUMS, tokenizer_ch_mult=(1,)
        )
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.mark.parametrize("family", ["infinity", "hart"])
def test_every_pass_of_the_transformer_is_one_graph_compiled_once(family):
    """LazyVAR's generation has dense passes (the scales before its group) and a routed, grouped one."""
    method = "lazyvar"
    pipe = _pipe(family)
    if method == "lazyvar":
        for module in pipe.transformer.modules():
            if hasattr(module, "processor"):  # the mask-free calls CUDA uses for grouped passes
                module.processor.grouped_attention = "per_scale"
    kwargs = {"height": INFINITY_SIZE[0], "width": INFINITY_SIZE[1]} if family == "infinity" else {}

    def generate():
        acceleration = LazyVARScheduler.from_preset(family) if method == "lazyvar" else None
        return pipe(
            "a red fox",
            generator=torch.Generator().manual_seed(0),
            guidance_scale=3.0,
            output_type="pt",
            acceleration=acceleration,
            **kwargs,
        ).images

    eager = generate()
    pipe.transformer.forward = torch.compile(pipe.transformer.forward, fullgraph=True, backend="eager", dynamic=False)
    counters.clear()
    first = generate()
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 1 and not counters["graph_break"]
    second = generate()
    assert counters["stats"]["unique_graphs"] == graphs  # same shapes, new tensors: nothing recompiled
    assert torch.equal(first, eager) and torch.equal(second, eager)
