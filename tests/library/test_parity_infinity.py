"""Parity with the official Infinity code (FoundationVision/Infinity), on golden fixtures recorded from it.

Driven only by the fixture folder: its manifest (configs and the exact call of every run), inputs and references.
``VAR_ACCEL_INFINITY_FIXTURE`` points the test at another folder of the same layout (other batch sizes, aspect ratios).
Tolerances are FIXTURE.md's. A missing folder fails loudly.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from diffusers_var_accel import InfinityBSQVAE, InfinityPipeline, InfinityTransformer, schedule_for_size

from fixture_utils import (
    assert_official_uint8,
    check_pipeline_uint8_image,
    load_fixture,
    official_call_kwargs,
    padded_text,
)

FIXTURE_DIR = Path(
    os.environ.get("VAR_ACCEL_INFINITY_FIXTURE", Path(__file__).resolve().parents[1] / "fixtures" / "infinity")
)


def _fixture():
    return load_fixture(FIXTURE_DIR, "Infinity", "VAR_ACCEL_INFINITY_FIXTURE")


MANIFEST, INPUTS, REF = _fixture() if (FIXTURE_DIR / "manifest.json").is_file() else (None, None, None)
RUNS = sorted(MANIFEST["runs"]) if MANIFEST else ["<fixture missing>"]


@pytest.fixture(scope="module")
def pipe():
    _fixture()
    transformer = InfinityTransformer.from_original_checkpoint(FIXTURE_DIR / "infinity_tiny.pth")
    vae = InfinityBSQVAE.from_original_checkpoint(FIXTURE_DIR / "vae_tiny.pth")
    pipeline = InfinityPipeline(transformer=transformer, vae=vae, text_encoder=None, tokenizer=None)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def _replay(pipe, run):
    """Run the pipeline with the exact call of a reference run; record head logits and bits per scale."""
    call = MANIFEST["runs"][run]["call"]
    embeds, mask = padded_text(INPUTS)
    recorded = {}

    def record(p, scale_index, scale, kwargs):
        recorded[scale_index] = {k: v.clone() for k, v in kwargs.items()}
        return {}

    teacher = [INPUTS[f"teacher_bits.{i}"] for i in range(call["gt_leak"])] if call["gt_leak"] else None
    latents = pipe(
        **official_call_kwargs(MANIFEST, call, embeds, mask),
        teacher_tokens=teacher,
        output_type="latent",
        callback_on_step_end=record,
        callback_on_step_end_tensor_inputs=["logits", "tokens", "latents"],
    ).images
    return latents, recorded


def test_schedule_matches_fixture():
    _fixture()
    schedule, _ = schedule_for_size(*MANIFEST["image_hw"])
    assert [list(s) for s in schedule] == [list(s) for s in MANIFEST["scale_schedule"]]
    assert INPUTS["scale_schedule"].tolist() == [list(s) for s in schedule]


def test_condition_vector(pipe):
    _fixture()
    if "greedy_cfg.cond_BD" not in REF:
        pytest.skip("fixture stores no cond_BD")
    embeds, mask = padded_text(INPUTS)
    uncond = pipe.transformer.null_text_embeds(mask)
    with torch.no_grad():
        condition = pipe.transformer.encode_condition(torch.cat((embeds, uncond)), torch.cat((mask, mask)))
    torch.testing.assert_close(condition.cond_RC, REF["greedy_cfg.cond_BD"], atol=1e-5, rtol=0)


@pytest.mark.parametrize("run", RUNS)
def test_reference_run(pipe, run):
    _fixture()
    num_scales = len(MANIFEST["scale_schedule"])
    latents, recorded = _replay(pipe, run)
    checked = 0
    for si in range(num_scales):
        key = f"{run}.head_logits.{si}"
        if key in REF:
            torch.testing.assert_close(recorded[si]["logits"].float(), REF[key], atol=1e-4, rtol=1e-5)
            checked += 1
        key = f"{run}.bits.{si}"
        if key in REF:
            assert torch.equal(recorded[si]["tokens"].reshape(REF[key].shape).to(torch.uint8), REF[key]), key
            checked += 1
        if MANIFEST["runs"][run]["call"]["gt_leak"] > si:
            teacher = INPUTS[f"teacher_bits.{si}"]
            assert torch.equal(recorded[si]["tokens"].reshape(teacher.shape).to(torch.uint8), teacher)
        key = f"{run}.next_input.{si}"
        if key in REF:
            prev = recorded[si - 1]["latents"]
            nxt = pipe.vae.next_scale_input(prev, tuple(MANIFEST["scale_schedule"][si][-2:]))
            torch.testing.assert_close(nxt, REF[key], atol=1e-6, rtol=0)
            checked += 1
    torch.testing.assert_close(latents.float(), REF[f"{run}.summed_codes"], atol=1e-6, rtol=0)

    # per-scale bit checksums from the manifest (greedy/teacher runs are also summarised there)
    summary = MANIFEST["runs"][run]["summary"]
    for si, frac in enumerate(summary.get("bits_ones_fraction", [])):
        assert abs(recorded[si]["tokens"].float().mean().item() - frac) <= 1e-6 + 0.5 / recorded[si]["tokens"].numel()

    # decoding
    decoded = pipe.vae.decode(latents)
    r0, c0 = MANIFEST["decoded_crop32_origin_rc"]
    if f"{run}.decoded_crop32_s0" in REF:
        torch.testing.assert_close(
            decoded[:1, :, r0 : r0 + 32, c0 : c0 + 32], REF[f"{run}.decoded_crop32_s0"], atol=1e-3, rtol=0
        )
    if f"{run}.decoded_sub4" in REF:
        torch.testing.assert_close(decoded[:, :, ::4, ::4], REF[f"{run}.decoded_sub4"], atol=1e-3, rtol=0)
    if "decoded_sum_per_sample" in summary:
        for b in range(decoded.shape[0]):
            err = abs(decoded[b].double().sum().item() - summary["decoded_sum_per_sample"][b])
            assert err <= 1e-4 * summary["decoded_abs_sum_per_sample"][b], (run, b, err)
    if f"{run}.img_uint8_bgr_s0" in REF:
        img = ((decoded[:1] + 1) / 2).permute(0, 2, 3, 1).mul(255).to(torch.uint8).flip(dims=(3,))
        assert_official_uint8(img, REF[f"{run}.img_uint8_bgr_s0"])
    assert checked > 0 or f"{run}.summed_codes" in REF


def test_pipeline_image_output_matches_official_uint8(pipe):
    """The user-facing image (output_type='np') is the official image up to rounding (official: truncation, BGR)."""
    _fixture()
    if not check_pipeline_uint8_image(pipe, MANIFEST, INPUTS, REF):
        pytest.skip("fixture stores no uint8 image")


def test_bfloat16_teacher_forced_logits_close(pipe):
    """bf16 weights under autocast: only the teacher-forced logits are comparable (FIXTURE.md: rel. L2 < 3e-2)."""
    _fixture()
    run = "teacher_forced_cfg"
    if run not in MANIFEST["runs"]:
        pytest.skip("fixture has no teacher-forced run")
    bf16 = InfinityPipeline(
        transformer=InfinityTransformer.from_original_checkpoint(
            FIXTURE_DIR / "infinity_tiny.pth", torch_dtype=torch.bfloat16
        ),
        vae=pipe.vae,
        text_encoder=None,
        tokenizer=None,
    )
    bf16.set_progress_bar_config(disable=True)
    _, recorded = _replay(bf16, run)
    for si in range(len(MANIFEST["scale_schedule"])):
        key = f"{run}.head_logits.{si}"
        if key in REF:
            ours = recorded[si]["logits"].float()
            assert ours.dtype == torch.float32 and bf16.transformer.dtype == torch.bfloat16
            rel = (ours - REF[key]).norm() / REF[key].norm()
            assert rel < 3e-2, (si, rel.item())
