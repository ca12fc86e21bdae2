"""Parity of ``FastVARScheduler`` with the official FastVAR code (csguoh/FastVAR, Infinity fork) on golden fixtures.

Driven only by the fixture folder (``tests/fixtures/fastvar/infinity``; ``VAR_ACCEL_FASTVAR_INFINITY_FIXTURE`` points
at another one of the same layout): the manifest holds the weights' configs, the official preset and the exact call
of every run; ``baseline.*`` runs are upstream Infinity (no acceleration), ``fastvar.*`` runs the FastVAR fork.
The official preset is keyed on scale widths and token counts; it is mapped here to scale indices of the fixture's
schedule. Tolerances are FIXTURE.md's (section 6). A missing folder fails loudly.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from diffusers_var_accel import (
    FastVARScheduler,
    InfinityBSQVAE,
    InfinityPipeline,
    InfinityTransformer,
    schedule_for_size,
)
from diffusers_var_accel.schedulers.scheduling_fastvar import num_kept_tokens

from fixture_utils import RecordingFastVAR, official_call_kwargs, padded_text

FIXTURE_DIR = Path(
    os.environ.get(
        "VAR_ACCEL_FASTVAR_INFINITY_FIXTURE", Path(__file__).resolve().parents[1] / "fixtures" / "fastvar" / "infinity"
    )
)
#: The official sublayer names of the fixture (``pts.*.sublayers``) -> the router's sublayer kinds.
SUBLAYER_KINDS = {"sa": "self_attn", "ca": "cross_attn", "ffn": "ffn"}


def _fixture():
    if not (FIXTURE_DIR / "manifest.json").is_file():
        pytest.fail(
            f"FastVAR fixture folder missing or incomplete: {FIXTURE_DIR} (set VAR_ACCEL_FASTVAR_INFINITY_FIXTURE)"
        )
    manifest = json.loads((FIXTURE_DIR / "manifest.json").read_text())
    return manifest, load_file(FIXTURE_DIR / "inputs.safetensors"), load_file(FIXTURE_DIR / "reference.safetensors")


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


# -- the official preset, mapped to scale indices of the fixture's schedule ----------------------------------------------
def _layer_range(value):
    """``pruned_layer_idx`` as ``[start, end)``: the manifest stores ``"range(a, b)"`` (or a list of layers)."""
    if isinstance(value, str):
        m = re.fullmatch(r"\s*range\(\s*(\d+)\s*,\s*(\d+)\s*\)\s*", value)
        assert m, f"cannot read pruned_layer_idx {value!r}"
        return [int(m.group(1)), int(m.group(2))]
    layers = sorted(int(v) for v in value)
    assert layers == list(range(layers[0], layers[-1] + 1)), f"pruned layers are not a contiguous range: {layers}"
    return [layers[0], layers[-1] + 1]


def _official_scheduler():
    """The official preset as a ``FastVARScheduler``: widths -> scale indices, cached token count -> the cache scale."""
    preset, schedule = MANIFEST["fastvar_preset"], MANIFEST["scale_schedule"]
    widths = [int(s[-1]) for s in schedule]
    prune_scales, prune_ratios = [], []
    for width, ratio in sorted(preset["prune_widths"].items(), key=lambda kv: int(kv[0])):
        for si in (
            i for i, w in enumerate(widths) if w == int(width)
        ):  # the official prunes every scale of that width
            prune_scales.append(si)
            prune_ratios.append(float(ratio))
    cached_tokens = int(preset["cached_size"][0]) * int(preset["cached_size"][1])
    # the official cache is (over)written at every scale with that token count; the last one before pruning counts
    cache = [i for i, s in enumerate(schedule) if int(s[-2]) * int(s[-1]) == cached_tokens and i < min(prune_scales)]
    assert cache, f"no scale of {cached_tokens} tokens before the pruned scales {prune_scales}"
    skipped = [i for i, w in enumerate(widths) if w in {int(v) for v in preset.get("skipped_scales_w", [])}]
    return FastVARScheduler(
        prune_scales=prune_scales,
        prune_ratios=prune_ratios,
        pruned_layers=_layer_range(preset["pruned_layer_idx"]),
        cache_scale=cache[-1],
        skip_last_scales=bool(skipped),
        skipped_scales=skipped,
        model_family="infinity",
    )


def _scale_of_tag(tag):
    """Scale index of a PTS tag ``"{h}x{w}"``."""
    h, w = (int(v) for v in tag.split("x"))
    matches = [i for i, s in enumerate(MANIFEST["scale_schedule"]) if (int(s[-2]), int(s[-1])) == (h, w)]
    assert len(matches) == 1, (tag, matches)
    return matches[0]


# -- replaying a run --------------------------------------------------------------------------------------------------
def _replay(pipe, run):
    """The pipeline with the exact call of a reference run (FastVAR for ``fastvar.*``); per-scale callback records."""
    impl = run.split(".")[0]
    assert impl in ("baseline", "fastvar"), f"unknown implementation {impl!r} in run {run!r}"
    call = MANIFEST["runs"][run]["call"]
    embeds, mask = padded_text(INPUTS, call["text_input"])
    assert embeds.shape[0] == call.get("B", embeds.shape[0])
    scheduler = None
    if impl == "fastvar":
        scheduler = RecordingFastVAR.build(
            **{k: v for k, v in _official_scheduler().to_dict().items() if k != "_class_name"}
        )
    recorded = {}

    def record(p, scale_index, scale, kwargs):
        recorded[scale_index] = {k: None if v is None else v.clone() for k, v in kwargs.items()}
        return {}

    gt_leak = call.get("gt_leak", 0)
    teacher = [INPUTS[f"teacher_bits.{i}"] for i in range(gt_leak)] if gt_leak else None
    latents = pipe(
        **official_call_kwargs(MANIFEST, call, embeds, mask),
        teacher_tokens=teacher,
        acceleration=scheduler,
        output_type="latent",
        callback_on_step_end=record,
        callback_on_step_end_tensor_inputs=["logits", "tokens", "latents"],
    ).images
    log = scheduler.log if scheduler is not None else None
    if scheduler is not None:
        del scheduler.log
    return latents, recorded, log


# -- tests ------------------------------------------------------------------------------------------------------------
def test_schedule_matches_fixture():
    _fixture()
    schedule, _ = schedule_for_size(*MANIFEST["image_hw"])
    assert [list(s) for s in schedule] == [list(s) for s in MANIFEST["scale_schedule"]]
    assert INPUTS["scale_schedule"].tolist() == [list(s) for s in schedule]


def test_official_preset_maps_to_our_infinity_preset():
    """On the fixture's schedule, ``from_preset("infinity")`` (scale indices from the end) is the official preset."""
    _fixture()
    schedule = [tuple(s) for s in MANIFEST["scale_schedule"]]
    official = _official_scheduler()
    ours = FastVARScheduler.from_preset("infinity")
    assert ours.resolve(schedule) == official.resolve(schedule)
    assert list(ours.config.pruned_layers) == list(official.config.pruned_layers)
    keep_rule = MANIFEST["fastvar_preset"].get("keep")
    assert keep_rule in (None, "L - int(L*ratio)"), keep_rule


@pytest.mark.parametrize("run", RUNS)
def test_reference_run(pipe, run):
    _fixture()
    meta = MANIFEST["runs"][run]
    num_scales = len(MANIFEST["scale_schedule"])
    processed = len(meta["processed_scales_hw"])
    latents, recorded, log = _replay(pipe, run)

    # 1. every scale reaches the callback; skipped scales (FastVAR) carry no tokens and no logits
    assert sorted(recorded) == list(range(num_scales))
    for si in range(processed, num_scales):
        assert recorded[si]["tokens"] is None and recorded[si]["logits"] is None, si
    # 2. bits exact and head logits close at every processed scale
    checked = 0
    for si in range(processed):
        bits = REF[f"{run}.bits.{si}"]
        assert torch.equal(recorded[si]["tokens"].reshape(bits.shape).to(torch.uint8), bits), (run, si)
        if f"{run}.head_logits.{si}" in REF:
            torch.testing.assert_close(
                recorded[si]["logits"].float(), REF[f"{run}.head_logits.{si}"], atol=1e-4, rtol=1e-5
            )
            checked += 1
    for si, frac in enumerate(meta["summary"].get("bits_ones_fraction", [])):
        assert abs(recorded[si]["tokens"].float().mean().item() - frac) <= 1e-6 + 0.5 / recorded[si]["tokens"].numel()
    # 3. the summed codes (the decoder input)
    torch.testing.assert_close(latents.float(), REF[f"{run}.summed_codes"], atol=1e-6, rtol=0)

    # 4. FastVAR decisions: kept sets, PTS scores, the CTR cache
    for tag, pts in meta.get("pts", {}).items():
        si = _scale_of_tag(tag)
        kinds = [SUBLAYER_KINDS[s] for s in pts["sublayers"]]
        kept_ref = REF[f"{run}.pts_kept.{tag}"]
        assert kept_ref.shape[:3] == (len(pts["pruned_blocks"]), len(kinds), pts["rows"])
        assert (
            kept_ref.shape[3]
            == pts["K"]
            == num_kept_tokens(pts["L"], MANIFEST["fastvar_preset"]["prune_widths"][tag.split("x")[1]])
        )
        routed = sorted({layer for (s, layer, _) in log["kept"] if s == si})
        assert routed == sorted(pts["pruned_blocks"]), (tag, routed)
        for bi, block in enumerate(pts["pruned_blocks"]):
            for j, kind in enumerate(kinds):
                ours = log["kept"][(si, block, kind)]
                want = kept_ref[bi, j].long().sort(-1).values
                assert torch.equal(ours.sort(-1).values, want), (run, tag, block, kind)
                if f"{run}.pts_score_at_K.{tag}" in REF:
                    s_K = log["scores"][(si, block, kind)].sort(-1, descending=True).values[:, pts["K"] - 1]
                    torch.testing.assert_close(s_K, REF[f"{run}.pts_score_at_K.{tag}"][bi, j], atol=0, rtol=1e-5)
        for key in (k for k in REF if k.startswith(f"{run}.pts_score_block") and k.endswith(f".{tag}")):
            block = int(re.search(r"pts_score_block(\d+)\.", key).group(1))
            for j, kind in enumerate(kinds):
                want, ours = REF[key][j], log["scores"][(si, block, kind)]
                err = (ours - want).abs().amax(-1)
                assert (err <= 1e-5 * want.abs().amax(-1)).all(), (key, kind, err)
    cache_scale = _official_scheduler().resolve([tuple(s) for s in MANIFEST["scale_schedule"]]).cache_scale
    for key in (k for k in REF if k.startswith(f"{run}.ctr_cache.")):
        block, kind = re.fullmatch(r".*\.ctr_cache\.block(\d+)\.(\w+)", key).groups()
        ours = log["updates"][(cache_scale, int(block), SUBLAYER_KINDS[kind])]
        torch.testing.assert_close(ours, REF[key], atol=1e-5, rtol=0)
        checked += 1

    # 5. decoding (the reference decodes a contiguous copy of summed_codes)
    decoded = pipe.vae.decode(latents)
    sub = MANIFEST["decoded_subsample"]
    if f"{run}.decoded_sub{sub}" in REF:
        torch.testing.assert_close(decoded[:, :, ::sub, ::sub], REF[f"{run}.decoded_sub{sub}"], atol=1e-4, rtol=0)
        checked += 1
    r0, c0 = MANIFEST["decoded_crop32_origin_rc"]
    if f"{run}.decoded_crop32_s0" in REF:
        torch.testing.assert_close(
            decoded[:1, :, r0 : r0 + 32, c0 : c0 + 32], REF[f"{run}.decoded_crop32_s0"], atol=1e-4, rtol=0
        )
    summary = meta["summary"]
    for b in range(decoded.shape[0]):
        err = abs(decoded[b].double().sum().item() - summary["decoded_sum_per_sample"][b])
        assert err <= 1e-5 * summary["decoded_abs_sum_per_sample"][b], (run, b, err)
    assert checked > 0


def test_condition_vector(pipe):
    """The pooled text vector of every run (cond rows, then uncond rows under CFG) as the fixture stores it."""
    _fixture()
    keys = [run for run in RUNS if f"{run}.cond_BD" in REF]
    if not keys:
        pytest.skip("fixture stores no cond_BD")
    for run in keys:
        call = MANIFEST["runs"][run]["call"]
        embeds, mask = padded_text(INPUTS, call["text_input"])
        if any(c != 1 for c in call["cfg_list"]):
            embeds, mask = torch.cat((embeds, pipe.transformer.null_text_embeds(mask))), torch.cat((mask, mask))
        with torch.no_grad():
            condition = pipe.transformer.encode_condition(embeds, mask)
        torch.testing.assert_close(condition.cond_RC, REF[f"{run}.cond_BD"], atol=1e-5, rtol=0)
