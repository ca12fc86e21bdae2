"""Parity with the official HART code (mit-han-lab/hart), on golden fixtures recorded from it.

Driven only by the fixture folder: the released on-disk layout (``hart-tiny/llm`` with EMA weights,
``hart-tiny/tokenizer``), the manifest (every run's exact call and seeds), inputs and references.
``VAR_ACCEL_HART_FIXTURE`` points the test at another folder of the same layout. Tolerances are FIXTURE.md's
suggested checks. A missing folder fails loudly.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file


from fixture_utils import HARTFixture, replay_hart_run

FIXTURE = HARTFixture("VAR_ACCEL_HART_FIXTURE", Path(__file__).resolve().parents[1] / "fixtures" / "hart", "HART")
FIXTURE_DIR, MANIFEST, RUNS = FIXTURE.folder, FIXTURE.manifest, FIXTURE.runs
_require_fixture = FIXTURE.require


@pytest.fixture(scope="module")
def pipe():
    return FIXTURE.pipeline()


@pytest.fixture(scope="module")
def inputs():
    return FIXTURE.inputs()


def test_config_matches_fixture(pipe):
    hart = MANIFEST["preset_params"]["hart"]
    cfg = pipe.transformer.config
    assert (cfg.depth, cfg.embed_dim, cfg.num_heads, cfg.context_tokens, cfg.context_dim) == (
        hart["depth"],
        hart["embed_dim"],
        hart["num_heads"],
        hart["context_token"],
        hart["context_dim"],
    )
    assert list(cfg.patch_nums) == list(hart["patch_nums"])
    assert pipe.default_size == pipe.vae_scale_factor * hart["patch_nums"][-1]


@pytest.mark.parametrize("run", RUNS)
def test_official_run(pipe, inputs, run):
    _require_fixture()
    meta = MANIFEST["runs"][run]
    ref = load_file(FIXTURE_DIR / f"ref_{run}.safetensors")
    image, recorded = replay_hart_run(pipe, inputs, meta)
    num_scales = len(meta["t_guidance_per_scale"])
    B = inputs["context_tensor"].shape[0]
    assert sorted(recorded) == list(range(num_scales))
    for s in range(num_scales):
        assert torch.equal(recorded[s]["tokens"], ref[f"idx_s{s}"]), (run, s)
        t = meta["t_guidance_per_scale"][s]
        raw = recorded[s]["logits"]
        guided = (1 + t) * raw[:B] - t * raw[B:] if raw.shape[0] > B else raw
        if f"logits_guided_s{s}" in ref:
            torch.testing.assert_close(guided, ref[f"logits_guided_s{s}"], atol=1e-3, rtol=0)
        if f"logits_guided_top32_values_s{s}" in ref:
            torch.testing.assert_close(
                guided.topk(32, dim=-1).values, ref[f"logits_guided_top32_values_s{s}"], atol=1e-3, rtol=0
            )
        if s < num_scales - 1 and f"f_hat_after_s{s}" in ref:
            torch.testing.assert_close(recorded[s]["latents"], ref[f"f_hat_after_s{s}"], atol=1e-4, rtol=1e-4)
    if "logits_raw_s1" in ref:
        torch.testing.assert_close(recorded[1]["logits"], ref["logits_raw_s1"], atol=1e-3, rtol=0)
    if "logits_raw_s0_lastctx" in ref:  # the guidance weight is 0 at scale 0: only the conditional rows are needed
        raw0 = recorded[0]["logits"]
        torch.testing.assert_close(raw0, ref["logits_raw_s0_lastctx"][: raw0.shape[0]], atol=1e-3, rtol=0)
    torch.testing.assert_close(recorded[num_scales - 1]["latents"], ref["f_hat_final"], atol=2e-3, rtol=0)
    atol = 1e-3 if meta["call"]["more_smooth"] else 1e-4
    torch.testing.assert_close(image, ref["image"], atol=atol, rtol=0)


def test_block_activations(pipe, inputs):
    """Block inputs/outputs of a guided greedy run, where the fixture stores them (hooks on the blocks)."""
    _require_fixture()
    run = next(
        (r for r in RUNS if MANIFEST["runs"][r]["greedy_top_k1"] and MANIFEST["runs"][r]["call"]["cfg"] != 0), None
    )
    ref = load_file(FIXTURE_DIR / f"ref_{run}.safetensors") if run else {}
    if not any(k.startswith("block0_input_s") for k in ref):
        pytest.skip("fixture stores no block activations")
    seen = {"in": [], "out": {}}
    blocks = pipe.transformer.blocks
    handles = [blocks[0].register_forward_pre_hook(lambda m, args: seen["in"].append(args[0].clone()))]
    for i, block in enumerate(blocks):
        handles.append(
            block.register_forward_hook(lambda m, args, out, i=i: seen["out"].setdefault(i, []).append(out.clone()))
        )
    try:
        replay_hart_run(pipe, inputs, MANIFEST["runs"][run])
    finally:
        for h in handles:
            h.remove()
    last = len(blocks) - 1
    for key, value in ref.items():
        if key.startswith("block0_input_s"):
            got = seen["in"][int(key.rsplit("_s", 1)[1])]
        elif key.startswith("last_block_output_s"):
            got = seen["out"][last][int(key.rsplit("_s", 1)[1])]
        elif key.startswith("block") and "_output_s" in key:
            got = seen["out"][int(key[len("block") : key.index("_")])][int(key.rsplit("_s", 1)[1])]
        else:
            continue
        torch.testing.assert_close(got, value, atol=1e-4, rtol=1e-4, msg=key)


def test_diffusion_condition_and_output(pipe, inputs):
    """The last scale's diffusion condition and output of the greedy runs (recorded at ``diffloss.sample``)."""
    _require_fixture()
    head = pipe.transformer.diffusion_head
    recorded = {}
    original = head.sample

    def spy(z, *args, **kwargs):
        out = original(z, *args, **kwargs)
        recorded["z"], recorded["out"] = z.clone(), out.clone()
        return out

    checked = 0
    for run in RUNS:
        meta = MANIFEST["runs"][run]
        ref = load_file(FIXTURE_DIR / f"ref_{run}.safetensors")
        if "diff_cond" not in ref or meta["call"]["cfg"] == 0:
            continue
        head.sample = spy
        try:
            replay_hart_run(pipe, inputs, meta)
        finally:
            del head.sample
        torch.testing.assert_close(recorded["z"], ref["diff_cond"], atol=1e-4, rtol=1e-4)
        N = ref["diff_out"].shape[0] // 2
        torch.testing.assert_close(recorded["out"][:N], ref["diff_out"][:N], atol=2e-3, rtol=0)
        checked += 1
    if not checked:
        pytest.skip("no guided greedy run with a stored diffusion condition")


def test_batch_equals_single_runs(pipe, inputs):
    """With one generator per image, every image of a batch equals its single run: the same tokens at every scale
    (sampled, CFG) and the same image up to fp32 rounding (a matmul's rounding depends on its row count)."""
    _require_fixture()
    B = inputs["context_tensor"].shape[0]

    def run(rows, more_smooth):
        tokens = {}

        def record(p, si, scale, kwargs):
            tokens[si] = kwargs["tokens"].clone()
            return {}

        image = pipe(
            prompt_embeds=inputs["context_tensor"][rows],
            prompt_position_ids=inputs["context_position_ids"][rows],
            generator=[torch.Generator().manual_seed(10 + b) for b in range(B)][rows],
            diffusion_generator=[torch.Generator().manual_seed(20 + b) for b in range(B)][rows],
            guidance_scale=4.5,
            more_smooth=more_smooth,
            output_type="pt",
            callback_on_step_end=record,
            callback_on_step_end_tensor_inputs=["tokens"],
        ).images
        return image, tokens

    for more_smooth, atol in ((False, 1e-5), (True, 1e-3)):  # Gumbel mixtures at tau ~ 0.05 amplify rounding
        batch, batch_tokens = run(slice(0, B), more_smooth)
        for b in range(B):
            single, single_tokens = run(slice(b, b + 1), more_smooth)
            for si, tokens in single_tokens.items():
                assert torch.equal(batch_tokens[si][b : b + 1], tokens), (more_smooth, b, si)
            torch.testing.assert_close(batch[b : b + 1], single, atol=atol, rtol=0)
