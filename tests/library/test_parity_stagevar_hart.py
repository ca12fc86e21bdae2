"""Parity of ``StageVARScheduler`` on HART with the official StageVAR code (FasterVAR's ``hart/``, over upstream HART),
on a golden fixture recorded from it (``tests/fixtures/stagevar_hart``, FIXTURE.md: commits, configuration, command).

Driven only by the fixture folder (``VAR_ACCEL_STAGEVAR_HART_FIXTURE`` points at another of the same layout): its
manifest (the per-scale guidance list of ``sample_fastervar.py``, the projected side, the ranks and the ratios the
official code used, the seeds), inputs and references. A missing folder fails loudly.

The scheduler is our HART preset (``hart-0.7b/stagevar``) with one chunk per layer of the fixture's model; the
fixture's ratios must be the first ones of the preset's table and its ranks ours. The official draw order: the
official code draws every layer's positions and projection, then the diffusion head's noise, from the process's
global generator (``torch.manual_seed`` before the call) and the tokens from the model's own; here one CPU generator
seeded the same way is given to every mixer and, after them, to the diffusion head (``diffusion_generator``), and the
tokens come from the call's generator seeded with ``g_seed``.

Checked: the tokens of every scale (exact) and their logits' top two (FIXTURE.md: atol 1e-3); per layer of the
projected scale the stream entering it, the drawn positions (exact), the projection, the projected mixtures, the
restored states, and the canvas source (the layer's output at the previous scale); the decoder input and the image.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from diffusers_var_accel import StageVARScheduler
from diffusers_var_accel.next_scale.plan import PassRoutes, RecordRequest
from diffusers_var_accel.schedulers.scheduling_stagevar import RepresentativeMixer

from fixture_utils import HARTFixture, LoggingMixer, check_hart_tokens_and_logits

FIXTURE = HARTFixture(
    "VAR_ACCEL_STAGEVAR_HART_FIXTURE",
    Path(__file__).resolve().parents[1] / "fixtures" / "stagevar_hart",
    "StageVAR HART",
)
FIXTURE_DIR, MANIFEST, RUNS = FIXTURE.folder, FIXTURE.manifest, FIXTURE.runs
_require_fixture = FIXTURE.require
#: FIXTURE.md's suggested checks for the projected scale's mixtures, block outputs and restored states: their values
#: reach ~4.4e3 (sums over 4096 tokens), which fp32 GEMMs round 2e-3 to 5e-3 apart.
MIXTURE_TOL = dict(atol=2e-2, rtol=1e-5)


@pytest.fixture(scope="module")
def pipe():
    return FIXTURE.pipeline()


def _scheduler(meta, patch_nums, depth):
    """Our HART preset on the fixture's model: one chunk per layer, the preset's first ``depth`` ratios."""
    cfg = meta["call"]["cfg"]
    n = len(cfg)
    assert n == len(patch_nums)
    preset = StageVARScheduler.from_preset("hart")
    unconditional = tuple(i - n for i, c in enumerate(cfg) if c == 0)
    assert unconditional == tuple(preset.config.unconditional_scales), unconditional
    projected = (patch_nums.index(meta["projected_side"]) - n,)
    assert projected == tuple(preset.config.projected_scales)
    ratios = tuple(preset.config.rank_ratios[0][:depth])
    assert list(ratios) == meta["rank_formula_values"]["ratios_used"]  # the released table
    return StageVARScheduler.from_preset("hart", num_chunks=depth, rank_ratios=(ratios,))


@pytest.mark.parametrize("run", RUNS)
def test_reference_run(pipe, run):
    _require_fixture()
    meta = MANIFEST["runs"][run]
    call = meta["call"]
    inputs = load_file(FIXTURE_DIR / "inputs.safetensors")
    ref = load_file(FIXTURE_DIR / f"ref_{run}.safetensors")
    patch_nums = list(pipe.transformer.config.patch_nums)
    depth, width = pipe.transformer.config.depth, pipe.transformer.config.embed_dim
    num_scales, projected = len(patch_nums), patch_nums.index(meta["projected_side"])
    scheduler = _scheduler(meta, patch_nums, depth)
    B = inputs["context_tensor"].shape[0]
    draws = torch.Generator().manual_seed(meta["torch_manual_seed_before_call"])  # the official global generator
    log, outputs = {}, {}

    class OfficialOrder(StageVARScheduler):
        def _generators(self, state, device):
            return [draws] * state.batch_size

        def route_pass(self, state, plan):
            routes = super().route_pass(state, plan)
            k = plan.scale_indices[0]
            if routes is not None and routes.mixing:
                routes.mixing = {
                    start: replace(m, mixer=LoggingMixer(m.mixer, start, log)) for start, m in routes.mixing.items()
                }
            if k in (projected - 1, projected):  # the canvas sources and the restored states of every layer
                routes = PassRoutes() if routes is None else routes
                routes.record = routes.record | RecordRequest(block_outputs=frozenset(range(depth)))
            return routes

        def after_scale(self, state, plan, hidden_states_RLC):
            k = plan.scale_indices[0]
            if k in (projected - 1, projected):
                outputs[k] = {layer: t.clone() for layer, t in state.records.block_outputs.items()}
            super().after_scale(state, plan, hidden_states_RLC)

    recording = OfficialOrder.from_config(scheduler.config)
    guided = sorted({c for c in call["cfg"] if c != 0})
    assert len(guided) == 1, call["cfg"]  # one guidance weight; the zeros are StageVAR's unguided scales
    recorded = {}

    def record(p, scale_index, scale, kwargs):
        recorded[scale_index] = {k: v.clone() for k, v in kwargs.items() if v is not None}
        return {}

    image = pipe(
        prompt_embeds=inputs["context_tensor"],
        prompt_position_ids=inputs["context_position_ids"],
        guidance_scale=guided[0],
        top_k=1 if meta["greedy_top_k1"] else None,
        top_p=call["top_p"],
        more_smooth=call["more_smooth"],
        use_diffusion_head=call["final_stage"] == 0,
        generator=torch.Generator().manual_seed(call["g_seed"]),
        diffusion_generator=draws,
        acceleration=recording,
        output_type="pt",
        callback_on_step_end=record,
        callback_on_step_end_tensor_inputs=["latents", "tokens", "logits"],
    ).images
    assert sorted(recorded) == list(range(num_scales))

    # 1. tokens exact at every scale; the logits sampled from (guided, or the unconditional rows' alone) close
    check_hart_tokens_and_logits(recorded, ref, meta, B, logits_key="logits")

    # 2. every layer of the projected scale: its input, draws, mixtures, restored output and canvas source
    assert sorted(log) == list(range(depth))
    for layer in range(depth):
        x, positions, projection = log[layer]
        rank = meta["ranks"][f"l{layer}"]
        assert positions.shape == (B, rank)
        ratio = scheduler.config.rank_ratios[0][layer]
        assert RepresentativeMixer(ratio, [], scheduler.config.rank_basis).rank(x.shape[1], width) == rank
        tol = dict(atol=1e-4, rtol=1e-5) if layer == 0 else MIXTURE_TOL  # later inputs carry restored mixtures
        torch.testing.assert_close(x, ref[f"rp_input_l{layer}"], **tol)
        assert torch.equal(positions, ref[f"rep_indices_l{layer}"]), f"layer {layer}: drawn positions"
        assert torch.equal(projection, ref[f"projection_l{layer}"]), f"layer {layer}: projection"
        torch.testing.assert_close(
            torch.bmm(projection.transpose(1, 2), x.float()), ref[f"projected_l{layer}"], **MIXTURE_TOL
        )
        restored = outputs[projected][layer]
        torch.testing.assert_close(restored, ref[f"restored_l{layer}"], **MIXTURE_TOL)
        torch.testing.assert_close(restored[:, positions[0]], ref[f"layer_output_l{layer}"], **MIXTURE_TOL)
        torch.testing.assert_close(outputs[projected - 1][layer], ref[f"canvas_source_l{layer}"], atol=1e-4, rtol=1e-5)
    assert patch_nums[projected - 1] == int(ref["cached_hw"])

    # 3. the decoder input and the image (FIXTURE.md: f_hat atol 2e-3, image 1e-3)
    torch.testing.assert_close(recorded[num_scales - 1]["latents"], ref["f_hat_final"], atol=2e-3, rtol=0)
    torch.testing.assert_close(image, ref["image"], atol=1e-3, rtol=0)
