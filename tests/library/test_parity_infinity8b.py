"""Parity with the official Infinity code on its 8B path (``apply_spatial_patchify=1``, the patch-8 d56-style VAE).

Driven only by the fixture folder: its manifest (configs, schedules and the exact call of every run), inputs and
references. ``VAR_ACCEL_INFINITY8B_FIXTURE`` points the test at another folder of the same layout (other batch sizes,
aspect ratios, guidance values). Tolerances are FIXTURE.md's; a missing folder fails loudly.

The two bit layouts (FIXTURE.md): the VAE layout ``(B, 1, 2h, 2w, d)`` and the token layout ``(B, h*w, 4d)``. Our loop
samples, records and routes tokens in the token layout; the summed codes and the decoder live on the VAE latent.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from diffusers_var_accel import InfinityBSQVAE, InfinityPipeline, InfinityTransformer, schedule_for_size
from diffusers_var_accel.models.transformer_infinity import latent_bits_to_tokens, tokens_to_latent_bits

from fixture_utils import (
    assert_official_uint8,
    check_pipeline_uint8_image,
    load_fixture,
    official_call_kwargs,
    padded_text,
)

FIXTURE_DIR = Path(
    os.environ.get("VAR_ACCEL_INFINITY8B_FIXTURE", Path(__file__).resolve().parents[1] / "fixtures" / "infinity8b")
)


def _fixture():
    return load_fixture(FIXTURE_DIR, "Infinity-8B", "VAR_ACCEL_INFINITY8B_FIXTURE")


MANIFEST, INPUTS, REF = _fixture() if (FIXTURE_DIR / "manifest.json").is_file() else (None, None, None)
RUNS = sorted(MANIFEST["runs"]) if MANIFEST else ["<fixture missing>"]
PATCHIFY = bool(MANIFEST["infinity_kwargs"]["apply_spatial_patchify"]) if MANIFEST else True


def _token_hw(si):
    return tuple(int(v) for v in MANIFEST["scale_schedule"][si][-2:])


@pytest.fixture(scope="module")
def pipe():
    _fixture()
    transformer = InfinityTransformer.from_original_checkpoint(
        FIXTURE_DIR / "infinity_tiny.pth", apply_spatial_patchify=PATCHIFY
    )
    vae = InfinityBSQVAE.from_original_checkpoint(FIXTURE_DIR / "vae_tiny.pth")
    pipeline = InfinityPipeline(transformer=transformer, vae=vae, text_encoder=None, tokenizer=None)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def _replay(pipe, run, teacher_layout="vae"):
    """Run the pipeline with the exact call of a reference run; record logits, tokens, f_hat and word_embed inputs."""
    call = MANIFEST["runs"][run]["call"]
    embeds, mask = padded_text(INPUTS)
    recorded, embed_inputs = {}, []

    def record(p, scale_index, scale, kwargs):
        recorded[scale_index] = {k: v.clone() for k, v in kwargs.items()}
        return {}

    hook = pipe.transformer.word_embed.register_forward_hook(lambda m, args, out: embed_inputs.append(args[0].clone()))
    name = "teacher_bits" if teacher_layout == "vae" else "teacher_bits_tokens"
    teacher = [INPUTS[f"{name}.{i}"] for i in range(call["gt_leak"])] if call["gt_leak"] else None
    try:
        latents = pipe(
            **official_call_kwargs(MANIFEST, call, embeds, mask),
            teacher_tokens=teacher,
            output_type="latent",
            callback_on_step_end=record,
            callback_on_step_end_tensor_inputs=["logits", "tokens", "latents"],
        ).images
    finally:
        hook.remove()
    return latents, recorded, embed_inputs


def test_config_and_schedules_match_fixture(pipe):
    _fixture()
    schedule, _ = schedule_for_size(*MANIFEST["image_hw"])
    assert [list(s) for s in schedule] == [list(s) for s in MANIFEST["scale_schedule"]]
    assert INPUTS["scale_schedule"].tolist() == [list(s) for s in schedule]
    p = pipe.transformer.token_patch_size
    assert p == (2 if PATCHIFY else 1)
    assert INPUTS["vae_scale_schedule"].tolist() == [[1, p * h, p * w] for _, h, w in schedule]
    d = pipe.vae.config.codebook_dim
    assert d == MANIFEST["vae_codebook_dim"]
    assert pipe.transformer.config.codebook_dim == MANIFEST["bits_per_token"] == p * p * d
    assert pipe.transformer.head.out_features == MANIFEST["head_channels"]
    assert pipe.vae.config.patch_size * p * schedule[-1][-1] == MANIFEST["image_hw"][1]


def test_sharded_checkpoint_loads_the_same_tensors(pipe):
    _fixture()
    expected = pipe.transformer.state_dict()
    for source in ("infinity_tiny_sharded", "infinity_tiny.safetensors"):
        model = InfinityTransformer.from_original_checkpoint(FIXTURE_DIR / source, apply_spatial_patchify=PATCHIFY)
        assert model.config == pipe.transformer.config, source
        got = model.state_dict()
        assert got.keys() == expected.keys(), source
        for key, value in expected.items():
            assert torch.equal(got[key], value), (source, key)


def test_bit_layout_helpers_match_fixture():
    """Both layouts of the fixture's teacher bits describe the same bits under our (un)patchify."""
    _fixture()
    for si in range(len(MANIFEST["scale_schedule"])):
        vae_bits, tok_bits = INPUTS[f"teacher_bits.{si}"], INPUTS[f"teacher_bits_tokens.{si}"]
        p = 2 if PATCHIFY else 1
        assert torch.equal(latent_bits_to_tokens(vae_bits, p), tok_bits)
        assert torch.equal(tokens_to_latent_bits(tok_bits, _token_hw(si), p), vae_bits)


def test_condition_vector(pipe):
    _fixture()
    if "greedy_cfg.cond_BD" not in REF:
        pytest.skip("fixture stores no cond_BD")
    embeds, mask = padded_text(INPUTS)
    uncond = pipe.transformer.null_text_embeds(mask)
    with torch.no_grad():
        condition = pipe.transformer.encode_condition(torch.cat((embeds, uncond)), torch.cat((mask, mask)))
    torch.testing.assert_close(condition.cond_RC, REF["greedy_cfg.cond_BD"], atol=1e-5, rtol=0)


def _check_run(pipe, run, latents, recorded, embed_inputs):
    num_scales = len(MANIFEST["scale_schedule"])
    call = MANIFEST["runs"][run]["call"]
    p = pipe.transformer.token_patch_size
    checked = 0
    for si in range(num_scales):
        hw = _token_hw(si)
        tokens = recorded[si]["tokens"]
        assert tokens.shape == (len(INPUTS["text.lens"]), hw[0] * hw[1], pipe.transformer.config.codebook_dim)
        key = f"{run}.head_logits.{si}"
        if key in REF:
            torch.testing.assert_close(recorded[si]["logits"].float(), REF[key], atol=1e-4, rtol=1e-5)
            checked += 1
        if f"{run}.bits_tokens.{si}" in REF:
            assert torch.equal(tokens.to(torch.uint8), REF[f"{run}.bits_tokens.{si}"]), (run, si)
            checked += 1
        if f"{run}.bits.{si}" in REF:
            assert torch.equal(tokens_to_latent_bits(tokens, hw, p).to(torch.uint8), REF[f"{run}.bits.{si}"]), (
                run,
                si,
            )
            checked += 1
        if call["gt_leak"] > si:
            assert torch.equal(tokens.to(torch.uint8), INPUTS[f"teacher_bits_tokens.{si}"])
            assert torch.equal(tokens_to_latent_bits(tokens, hw, p).to(torch.uint8), INPUTS[f"teacher_bits.{si}"])
        key = f"{run}.next_input.{si}"
        if key in REF:
            # the word_embed input of scale si (one pass per scale without acceleration: call si - 1 of the hook)
            torch.testing.assert_close(embed_inputs[si - 1].float(), REF[key], atol=1e-6, rtol=0)
            checked += 1
    assert len(embed_inputs) == num_scales - 1
    torch.testing.assert_close(latents.float(), REF[f"{run}.summed_codes"], atol=1e-6, rtol=0)
    if f"{run}.summed_codes_patchified" in REF:
        patchified = F.pixel_unshuffle(latents.float(), p) if p != 1 else latents.float()
        torch.testing.assert_close(patchified, REF[f"{run}.summed_codes_patchified"], atol=1e-6, rtol=0)

    summary = MANIFEST["runs"][run]["summary"]
    for si, frac in enumerate(summary.get("bits_ones_fraction", [])):
        t = recorded[si]["tokens"]
        assert abs(t.float().mean().item() - frac) <= 1e-6 + 0.5 / t.numel()

    decoded = pipe.vae.decode(latents)
    assert tuple(decoded.shape[-2:]) == tuple(MANIFEST["image_hw"])
    r0, c0 = MANIFEST["decoded_crop32_origin_rc"]
    if f"{run}.decoded_crop32_s0" in REF:
        torch.testing.assert_close(
            decoded[:1, :, r0 : r0 + 32, c0 : c0 + 32], REF[f"{run}.decoded_crop32_s0"], atol=1e-3, rtol=0
        )
        checked += 1
    if f"{run}.decoded_sub4" in REF:
        torch.testing.assert_close(decoded[:, :, ::4, ::4], REF[f"{run}.decoded_sub4"], atol=1e-3, rtol=0)
    if "decoded_sum_per_sample" in summary:
        for b in range(decoded.shape[0]):
            err = abs(decoded[b].double().sum().item() - summary["decoded_sum_per_sample"][b])
            assert err <= 1e-4 * summary["decoded_abs_sum_per_sample"][b], (run, b, err)
    if f"{run}.img_uint8_bgr_s0" in REF:
        img = ((decoded[:1] + 1) / 2).permute(0, 2, 3, 1).mul(255).to(torch.uint8).flip(dims=(3,))
        assert_official_uint8(img, REF[f"{run}.img_uint8_bgr_s0"])
    assert checked > 0


@pytest.mark.parametrize("run", RUNS)
def test_reference_run(pipe, run):
    _fixture()
    _check_run(pipe, run, *_replay(pipe, run))


def test_teacher_bits_in_token_layout(pipe):
    """The teacher-forced run fed with the token-layout teacher bits gives the same results as with the VAE layout."""
    _fixture()
    runs = [r for r in RUNS if MANIFEST["runs"][r]["call"]["gt_leak"]]
    if not runs:
        pytest.skip("fixture has no teacher-forced run")
    for run in runs:
        _check_run(pipe, run, *_replay(pipe, run, teacher_layout="tokens"))


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
    transformer = InfinityTransformer.from_original_checkpoint(
        FIXTURE_DIR / "infinity_tiny.pth", torch_dtype=torch.bfloat16, apply_spatial_patchify=PATCHIFY
    )
    bf16 = InfinityPipeline(transformer=transformer, vae=pipe.vae, text_encoder=None, tokenizer=None)
    bf16.set_progress_bar_config(disable=True)
    _, recorded, _ = _replay(bf16, run)
    compared = 0
    for si in range(len(MANIFEST["scale_schedule"])):
        key = f"{run}.head_logits.{si}"
        if key in REF:
            ours = recorded[si]["logits"].float()
            rel = (ours - REF[key]).norm() / REF[key].norm()
            assert rel < 3e-2, (si, rel.item())
            compared += 1
    assert compared > 0 and bf16.transformer.dtype == torch.bfloat16


def test_teacher_bits_of_the_wrong_shape_are_named(pipe):
    _fixture()
    embeds, mask = padded_text(INPUTS)
    call = (
        MANIFEST["runs"]["greedy_cfg"]["call"]
        if "greedy_cfg" in MANIFEST["runs"]
        else next(iter(MANIFEST["runs"].values()))["call"]
    )
    good = INPUTS["teacher_bits.0"]
    # the call's shape check names the scale and the token layout; the family's names the VAE layout
    for bad, match in (
        (good[:, :, :1], r"teacher_tokens\[0\]|VAE layout"),
        (good.reshape(good.shape[0], -1)[:, None, :3], r"teacher_tokens\[0\]|teacher bits of scale 0"),
        ([INPUTS[f"teacher_bits.{si}"] for si in range(len(MANIFEST["scale_schedule"]))] + [good], "the schedule has"),
    ):
        with pytest.raises(ValueError, match=match):
            pipe(
                **official_call_kwargs(MANIFEST, call, embeds, mask),
                teacher_tokens=bad if isinstance(bad, list) else [bad],
                output_type="latent",
            )
