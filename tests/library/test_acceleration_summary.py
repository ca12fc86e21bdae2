"""``pipe.acceleration_summary()`` says what the last call's passes computed, for every method and a composition.

Each case runs one call with forward hooks on every block's self-attention and FFN (what the modules were actually
given: rows and tokens per pass) and checks the summary against them, against the scheduler's plan (scales grouped or
skipped, which CFG rows ran) and against the KV cache (the positions each layer kept are the self-attention tokens of
every pass that stores its keys).
"""

from __future__ import annotations

import pytest
import torch

from diffusers_var_accel.next_scale.plan import ModelInfo
from registry_lists import CASES_WITH_BASELINE_AND_COMPOSITION, SMALLEST_SIZE, tiny_scheduler


def schedule_of(pipe, family):
    if family == "infinity":
        return pipe.scale_schedule_for(**SMALLEST_SIZE[family])[0]
    return [(1, p, p) for p in pipe.transformer.config.patch_nums]


def attention_and_ffn(block):
    return (block.sa if hasattr(block, "sa") else block.attn), block.ffn


@pytest.mark.parametrize("method, family", CASES_WITH_BASELINE_AND_COMPOSITION)
def test_the_summary_is_what_the_modules_ran_and_what_the_plan_says(method, family, pipes):
    pipe = pipes(family)
    scheduler = tiny_scheduler(method, family)
    seen, per_pass = [], []
    hooks = []
    for layer, block in enumerate(pipe.transformer.blocks):
        for kind, module in zip(("self_attn", "ffn"), attention_and_ffn(block)):
            hooks.append(
                module.register_forward_hook(
                    lambda m, args, out, key=(layer, kind): seen.append((key, args[0].shape[0], args[0].shape[1]))
                )
            )

    def on_scale(p, scale_index, scale, values):
        if seen:
            per_pass.append(list(seen))
            seen.clear()
        return {}

    try:
        pipe(
            "a red fox",
            generator=torch.Generator().manual_seed(0),
            acceleration=scheduler,
            guidance_scale=3.0,
            output_type="latent",
            callback_on_step_end=on_scale,
            **SMALLEST_SIZE[family],
        )
    finally:
        for hook in hooks:
            hook.remove()
    summary = pipe.acceleration_summary()
    passes = summary["passes"]
    num_layers = len(pipe.transformer.blocks)
    schedule = schedule_of(pipe, family)

    # the plan: scales grouped or skipped, rows run
    plans = (
        [None] * len(schedule)
        if scheduler is None
        else scheduler.plan_scales(tuple(map(tuple, schedule)), ModelInfo(num_layers, family))
    )
    if scheduler is not None:
        assert [p["scales"] for p in passes] == [list(plan.scale_indices) for plan in plans]
        assert [p["skipped"] for p in passes] == [plan.skip for plan in plans]
        for p, plan in zip(passes, plans):
            if not plan.skip:
                halved = plan.cfg_halve or plan.cfg_uncond_only
                assert p["rows_run"] == (1 if halved else 2) and p["unconditional_ran"] == (not plan.cfg_halve)
    else:
        assert [p["scales"] for p in passes] == [[i] for i in range(len(schedule))]
        assert all(p["rows_run"] == 2 and p["unconditional_ran"] for p in passes)

    # what the modules were given
    ran = [p for p in passes if not p["skipped"]]
    assert len(per_pass) == len(ran)
    for p, calls in zip(ran, per_pass):
        given = {kind: [0] * num_layers for kind in ("self_attn", "ffn")}
        for (layer, kind), rows, tokens in calls:
            assert rows == p["rows_run"]
            given[kind][layer] += tokens
        for kind in ("self_attn", "ffn"):
            assert p["tokens_computed_per_layer"][kind] == given[kind], (p["scales"], kind)
        assert p["layers_per_token"] == pytest.approx(sum(given["self_attn"]) / p["input_tokens"])

    # the KV cache: every pass that ran but the last stores its self-attention tokens
    stored = ran[:-1]
    expected = [sum(p["tokens_computed_per_layer"]["self_attn"][layer] for p in stored) for layer in range(num_layers)]
    assert summary["kv_positions"] == expected
    assert summary["kv_bytes"] > 0
    assert summary["token_layers"] == sum(sum(p["tokens_computed_per_layer"]["self_attn"]) for p in passes)
    if scheduler is None:
        assert summary["token_layers"] == summary["baseline_token_layers"]
    else:
        assert summary["token_layers"] < summary["baseline_token_layers"]


def test_the_summary_needs_a_call(pipes):
    from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline

    with pytest.raises(RuntimeError, match="last call"):
        build_tiny_infinity_pipeline(seed=0, depth=2).acceleration_summary()
