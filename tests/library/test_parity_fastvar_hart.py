"""Parity of ``FastVARScheduler`` on HART with the official FastVAR HART fork (csguoh/FastVAR ``HART/``).

Driven only by the fixture folder (``tests/fixtures/fastvar/hart``; ``VAR_ACCEL_FASTVAR_HART_FIXTURE`` points at
another of the same layout): ``baseline_*`` runs are upstream HART, ``fastvar_*`` runs the fork, with the official
preset (pruned scale sides, ratios, cache side) read from the manifest and mapped to scale indices. Tolerances are
FIXTURE.md's suggested checks. A missing folder fails loudly.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from diffusers_var_accel import FastVARScheduler
from fixture_utils import HARTFixture, RecordingFastVAR, check_hart_tokens_and_logits, replay_hart_run

FIXTURE = HARTFixture(
    "VAR_ACCEL_FASTVAR_HART_FIXTURE",
    Path(__file__).resolve().parents[1] / "fixtures" / "fastvar" / "hart",
    "FastVAR HART",
)
FIXTURE_DIR, MANIFEST, RUNS = FIXTURE.folder, FIXTURE.manifest, FIXTURE.runs
_require_fixture = FIXTURE.require
#: The fork's sublayer names -> the router's sublayer kinds.
SUBLAYER_KINDS = {"attn": "self_attn", "ffn": "ffn"}
#: FIXTURE.md, suggested checks for this layout: ``f_hat_final`` atol 2e-3 (the public fixture's bound; observed
#: 2.4e-4), and 1e-2 for the few elements of a run whose 4-step diffusion head multiplies epsilon errors by ~1e4 before
#: its clamp (one hidden run of this layout: 6.2e-3 on a few elements). So every element within F_HAT_ATOL_FEW and
#: all but F_HAT_FEW_FRACTION of them within F_HAT_ATOL.
F_HAT_ATOL = 2e-3
F_HAT_ATOL_FEW = 1e-2
F_HAT_FEW_FRACTION = 1e-2


@pytest.fixture(scope="module")
def pipe():
    return FIXTURE.pipeline()


@pytest.fixture(scope="module")
def inputs():
    return FIXTURE.inputs()


def _official_scheduler(patch_nums):
    """The fork's preset (keyed on scale sides) as a ``FastVARScheduler`` on scale indices."""
    preset = MANIFEST["fastvar_preset"]
    prune = sorted((patch_nums.index(int(side)), float(r)) for side, r in preset["prune_widths"].items())
    cache_side = int(preset["cache_scale_step"][0])
    assert preset.get("pruned_layers") == "all blocks", preset.get("pruned_layers")
    assert preset.get("keep", "L - int(L*ratio)") == "L - int(L*ratio)"
    skipped = [patch_nums.index(int(s)) for s in preset.get("skipped_scales", [])]
    return FastVARScheduler(
        prune_scales=[s for s, _ in prune],
        prune_ratios=[r for _, r in prune],
        pruned_layers=None,
        cache_scale=patch_nums.index(cache_side),
        skip_last_scales=bool(skipped),
        skipped_scales=skipped,
        model_family="hart",
    )


def test_official_preset_is_our_hart_preset(pipe):
    _require_fixture()
    patch_nums = list(pipe.transformer.config.patch_nums)
    schedule = [(1, pn, pn) for pn in patch_nums]
    ours = FastVARScheduler.from_preset("hart")
    official = _official_scheduler(patch_nums)
    assert ours.resolve(schedule) == official.resolve(schedule)
    assert ours.config.pruned_layers is None and ours.config.model_family == "hart"


@pytest.mark.parametrize("run", RUNS)
def test_reference_run(pipe, inputs, run):
    _require_fixture()
    meta = MANIFEST["runs"][run]
    impl = run.split("_", 1)[0]
    assert impl in ("baseline", "fastvar"), run
    patch_nums = list(pipe.transformer.config.patch_nums)
    scheduler = None
    if impl == "fastvar":
        scheduler = RecordingFastVAR.build(
            **{k: v for k, v in _official_scheduler(patch_nums).to_dict().items() if k != "_class_name"}
        )
    image, recorded = replay_hart_run(pipe, inputs, meta, greedy=True, acceleration=scheduler)  # every run is greedy
    ref = load_file(FIXTURE_DIR / f"ref_{run}.safetensors")
    B = inputs["context_tensor"].shape[0]
    num_scales = len(meta["t_guidance_per_scale"])
    assert sorted(recorded) == list(range(num_scales))

    # 1. tokens exact, guided logits close at every scale
    check_hart_tokens_and_logits(recorded, ref, meta, B)

    # 2. the decoder input and the image
    if "f_hat_final" in ref:
        # FIXTURE.md's bounds for this layout: 2e-3 everywhere but a few elements, which the 4-step diffusion head can
        # push to 1e-2 on some weights and guidance values (it multiplies epsilon errors by ~1e4 before its clamp)
        f_hat = recorded[num_scales - 1]["latents"]
        torch.testing.assert_close(f_hat, ref["f_hat_final"], atol=F_HAT_ATOL_FEW, rtol=0)
        beyond = ((f_hat.float() - ref["f_hat_final"].float()).abs() > F_HAT_ATOL).float().mean().item()
        assert beyond <= F_HAT_FEW_FRACTION, f"{beyond:.2%} of f_hat_final beyond {F_HAT_ATOL}"
    key, step = ("image", 1) if "image" in ref else ("image_sub2", 2)
    torch.testing.assert_close(image[:, :, ::step, ::step], ref[key], atol=1e-3, rtol=0)

    # 3. FastVAR's decisions: kept sets (as sets), the official block-0 scores, the CTR cache
    if scheduler is None:
        return
    log = scheduler.log
    for tag, pts in meta.get("pts", {}).items():
        side = int(tag.split("x")[0])
        si = patch_nums.index(side)
        kept_ref = ref[f"pts_kept_{tag}"]
        for b, block in enumerate(pts["pruned_blocks"]):
            for sl, name in enumerate(pts["sublayers"]):
                ours = log["kept"][(si, block, SUBLAYER_KINDS[name])]
                assert ours.shape[1] == pts["K"]
                rows = _common_rows(ours, kept_ref[b, sl], B)
                assert torch.equal(ours[:rows].sort(-1).values, kept_ref[b, sl][:rows].long().sort(-1).values), (
                    tag,
                    block,
                    name,
                )
        if f"pts_score_block0_{tag}" in ref:
            for sl, name in enumerate(pts["sublayers"]):
                scores = log["scores"][(si, pts["pruned_blocks"][0], SUBLAYER_KINDS[name])]
                expected = ref[f"pts_score_block0_{tag}"][sl]
                rows = _common_rows(scores, expected, B)
                torch.testing.assert_close(scores[:rows], expected[:rows], atol=1e-4, rtol=1e-5)
    if "ctr_cache_block0_attn" in ref:
        cache_side = int(MANIFEST["fastvar_preset"]["cache_scale_step"][0])
        update = log["updates"][(patch_nums.index(cache_side), 0, "self_attn")]
        rows = _common_rows(update, ref["ctr_cache_block0_attn"], B)
        torch.testing.assert_close(update[:rows], ref["ctr_cache_block0_attn"][:rows], atol=1e-4, rtol=1e-4)


def _common_rows(ours, official, batch_size):
    """The rows both sides computed. The official fork always runs the 2B CFG rows (``[cond.., uncond..]``), even when
    the guidance has no effect; we run only the B conditional rows then. Conditional rows come first on both sides."""
    rows = min(ours.shape[0], official.shape[0])
    assert rows in (batch_size, 2 * batch_size) and ours.shape[0] in (batch_size, 2 * batch_size), (
        ours.shape,
        official.shape,
    )
    return rows
