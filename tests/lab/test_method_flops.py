"""The FLOP meter on the methods' own plans: DepthVAR's dynamic scales and StageVAR's released setting cost fewer
FLOPs, counted on meta tensors (the methods' behaviour itself: tests/library/test_scheduler_<method>.py)."""

from __future__ import annotations

from diffusers_var_accel import DepthVARScheduler, StageVARScheduler

from diffusers_var_accel.models.infinity_resolutions import rope_grid_hw

from test_scheduler_depthvar import DEPTH, DYNAMIC, SCHEDULE


def test_depthvar_flops_are_counted_on_meta_tensors():
    from diffusers_var_accel.lab.bench.flops import build_on_meta, count_generation_flops
    from diffusers_var_accel import InfinityBSQVAE, InfinityTransformer

    config = dict(
        depth=DEPTH, embed_dim=64, num_heads=4, mlp_ratio=4.0, text_channels=48, text_maxlen=16, codebook_dim=8
    )
    vae = build_on_meta(
        InfinityBSQVAE, codebook_dim=8, base_ch=32, encoder_ch_mult=(1, 1), decoder_ch_mult=(1, 1), patch_size=2
    )
    transformer = build_on_meta(InfinityTransformer, **config)
    counts = [
        count_generation_flops(transformer, vae, SCHEDULE, rope_grid_hw(1.0), text_tokens=5, scheduler=s)
        for s in (None, DepthVARScheduler(reference_scale=-3))
    ]
    base, fast = ([s["blocks_flops"] for s in c["per_scale"]] for c in counts)
    assert base[: DYNAMIC[0]] == fast[: DYNAMIC[0]] and all(fast[k] < 0.6 * base[k] for k in DYNAMIC)


def test_stagevar_flops_are_counted_on_meta_tensors_and_fall_as_the_plan_says():
    """The released setting at the Infinity-2B structure (1024², CFG), counted on meta tensors (the mixer draws
    nothing there): fewer FLOPs than the baseline, and the same as the baseline on the untouched scales."""
    from diffusers_var_accel import schedule_for_size
    from diffusers_var_accel.lab.bench import flops as F
    from diffusers_var_accel.models.autoencoder_bsq import InfinityBSQVAE
    from diffusers_var_accel.models.infinity_resolutions import rope_grid_hw
    from diffusers_var_accel.models.transformer_infinity import InfinityTransformer

    spec = F.MODEL_SPECS["infinity-2b"]
    schedule, template = schedule_for_size(1024, 1024)
    counts = {}
    for name, scheduler in (("baseline", None), ("stagevar", StageVARScheduler())):
        transformer, vae = (
            F.build_on_meta(InfinityTransformer, **spec.transformer),
            F.build_on_meta(InfinityBSQVAE, **spec.vae),
        )
        counts[name] = F.count_generation_flops(
            transformer, vae, schedule, rope_grid_hw(template), scheduler=scheduler
        )
    base, stage = counts["baseline"], counts["stagevar"]
    assert base["total_flops"] / stage["total_flops"] > 3.4  # 3.88x at the time of writing (docs/stagevar.md)
    per_base, per_stage = [s["flops"] for s in base["per_scale"]], [s["flops"] for s in stage["per_scale"]]
    assert per_stage[:10] == per_base[:10] and per_stage[10] < per_base[10] / 4 and per_stage[11:] == [0, 0]
