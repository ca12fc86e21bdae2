"""Tests of ``var-accel flops``: counted FLOPs against an analytic count written from the architecture notes.

The analytic count below is written from ``ARCHITECTURE.md`` (sections 3-6), not from the benchmark's code. It counts
2 FLOPs per multiply-accumulate of every matmul: linear layers and attention (QK^T and PV). It leaves out the
element-wise work (norms, softmax, GELU, RoPE, interpolation, biases), which ``FlopCounterMode`` does not count
either, so counted and analytic numbers must agree exactly.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from diffusers_var_accel.lab.bench.flops import build_on_meta, count_generation_flops, make_flop_counter  # noqa: E402
from diffusers_var_accel.models.autoencoder_bsq import InfinityBSQVAE  # noqa: E402
from diffusers_var_accel.models.infinity_resolutions import infinity_scale_schedule, rope_grid_hw  # noqa: E402
from diffusers_var_accel.models.transformer_infinity import INFINITY_CONFIGS, InfinityTransformer  # noqa: E402

TINY = dict(depth=2, embed_dim=64, num_heads=4, mlp_ratio=4.0, text_channels=48, text_maxlen=16, codebook_dim=8)
TINY_VAE = dict(codebook_dim=8, base_ch=32, encoder_ch_mult=(1, 1), decoder_ch_mult=(1, 1), patch_size=2)
TINY_SCHEDULE = infinity_scale_schedule(1.0, "0.06M")[:5]  # 1x1, 2x2, 4x4, 6x6, 8x8
TEXT_TOKENS = 5


# ---------------------------------------------------------------------------------------------------------------------
# analytic count (from ARCHITECTURE.md)
# ---------------------------------------------------------------------------------------------------------------------
def analytic_text_flops(cfg, rows, T):
    """encode_condition on ``rows`` rows of T tokens: pooling K/V + QK^T/PV + proj, text_proj_for_ca, shared AdaLN."""
    C, D = cfg["embed_dim"], cfg["text_channels"]
    pool = 2 * rows * T * D * 2 * C + 4 * rows * 1 * T * C + 2 * rows * C * C
    proj_ca = 2 * rows * T * (D * C + C * C)
    shared_ada = 2 * rows * C * 6 * C
    return pool + proj_ca + shared_ada


def analytic_scale_flops(cfg, rows, batch, L, S, T, first):
    """One scale: L new tokens, S = keys seen (cache + own), ``rows`` rows through blocks and head, T text tokens.

    Per block: self-attn qkv (C->3C) and proj, QK^T and PV over S keys; cross-attn q and proj, text K/V (C->2C on T
    tokens; once per call, in the first pass, which every later pass reuses: the official code recomputes it every
    scale, same values), QK^T and PV over T keys; FFN C->F->C. Head: head AdaLN
    (C->2C on the pooled text, per row; also once per call for the call's rows, at the first scale) and C->2d. Input embedding word_embed (d->C) runs on the B image rows only
    (the CFG rows are a repeat), and not at scale 0 (the start token is the pooled text).
    """
    C, d, N = cfg["embed_dim"], cfg["codebook_dim"], cfg["depth"]
    F = round(C * cfg["mlp_ratio"] / 256) * 256
    block = (
        2 * rows * L * C * 3 * C
        + 2 * rows * L * C * C  # self-attn projections
        + 4 * rows * L * S * C  # self-attn QK^T + PV (H heads x c = C)
        + 2 * rows * L * C * C
        + (2 * rows * T * C * 2 * C if first else 0)
        + 2 * rows * L * C * C  # cross q, K/V, proj
        + 4 * rows * L * T * C  # cross QK^T + PV
        + 2 * rows * L * C * F * 2  # FFN
    )
    head = (2 * rows * C * 2 * C if first else 0) + 2 * rows * L * C * 2 * d
    embed = 0 if first else 2 * batch * L * d * C
    return dict(blocks=N * block, head=head, embed=embed, total=N * block + head + embed)


def analytic_generation(cfg, schedule, batch, cfg_on, T):
    rows = 2 * batch if cfg_on else batch
    out, S = [], 0
    for si, s in enumerate(schedule):
        L = s[-2] * s[-1]
        S += L
        out.append(analytic_scale_flops(cfg, rows, batch, L, S, T, first=si == 0))
    return analytic_text_flops(cfg, rows, T), out


def _tiny_models(device):
    if device == "meta":
        return build_on_meta(InfinityTransformer, **TINY), build_on_meta(InfinityBSQVAE, **TINY_VAE)
    torch.manual_seed(0)
    return InfinityTransformer(**TINY).eval(), InfinityBSQVAE(**TINY_VAE).eval()


def _count_tiny(device, cfg_on, batch=1):
    transformer, vae = _tiny_models(device)
    return count_generation_flops(
        transformer, vae, TINY_SCHEDULE, rope_grid_hw(1.0), cfg=cfg_on, batch_size=batch, text_tokens=TEXT_TOKENS
    )


# ---------------------------------------------------------------------------------------------------------------------
# (1) counted == analytic on a tiny config, on meta and on real CPU tensors
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", ["meta", "cpu"])
@pytest.mark.parametrize("cfg_on,batch", [(True, 1), (False, 2)])
def test_tiny_counts_match_analytic(device, cfg_on, batch):
    result = _count_tiny(device, cfg_on, batch)
    text, scales = analytic_generation(TINY, TINY_SCHEDULE, batch, cfg_on, TEXT_TOKENS)
    assert result["text_flops"] == text
    assert len(result["per_scale"]) == len(TINY_SCHEDULE)
    for counted, expected in zip(result["per_scale"], scales):
        assert counted["blocks_flops"] == expected["blocks"], counted["scale_index"]
        assert counted["head_flops"] == expected["head"], counted["scale_index"]
        assert counted["embed_flops"] == expected["embed"], counted["scale_index"]
        assert counted["flops"] == expected["total"], counted["scale_index"]  # nothing else (codes: 0 FLOPs)
    assert result["transformer_flops"] == sum(s["total"] for s in scales)
    assert sum(result["transformer_breakdown"].values()) == result["transformer_flops"]  # sublayer split is complete
    # Attention really is counted (meta: decomposed to bmm; CPU: the registered SDPA formula).
    C, rows = TINY["embed_dim"], result["rows"]
    S, core = 0, 0
    for s in TINY_SCHEDULE:
        L = s[-2] * s[-1]
        S += L
        core += TINY["depth"] * 4 * rows * L * (S + TEXT_TOKENS) * C
    assert result["attention_core_flops"] == core > 0
    assert result["vae_flops"] > 0


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_tiny_patchify_counts_match_analytic(device):
    """The 8B path (apply_spatial_patchify): blocks, head (8 d_vae logits) and embed (4 d_vae inputs) on the token
    schedule, as the analytic count with bits per token = 4 d_vae; the decoder on the 2x larger latent."""
    config = dict(TINY, apply_spatial_patchify=True)  # 8 bits per token = 2x2 patches of a 2-channel latent
    vae_config = dict(TINY_VAE, codebook_dim=2)
    if device == "meta":
        transformer, vae = build_on_meta(InfinityTransformer, **config), build_on_meta(InfinityBSQVAE, **vae_config)
    else:
        torch.manual_seed(0)
        transformer, vae = InfinityTransformer(**config).eval(), InfinityBSQVAE(**vae_config).eval()
    result = count_generation_flops(
        transformer,
        vae,
        TINY_SCHEDULE,
        rope_grid_hw(1.0),
        cfg=True,
        batch_size=2,
        text_tokens=TEXT_TOKENS,
        spatial_patchify=True,
    )
    text, scales = analytic_generation(TINY, TINY_SCHEDULE, 2, True, TEXT_TOKENS)
    assert result["text_flops"] == text
    for counted, expected in zip(result["per_scale"], scales):
        for key in ("blocks", "head", "embed"):
            assert counted[f"{key}_flops"] == expected[key], (key, counted["scale_index"])
    _, h, w = TINY_SCHEDULE[-1]
    mode = make_flop_counter()
    with mode, torch.no_grad():
        vae.decode(torch.zeros(2, 2, 2 * h, 2 * w, device="meta" if device == "meta" else "cpu"))
    assert result["vae_flops"] == mode.get_total_flops() > 0
    with pytest.raises(ValueError, match="spatial_patchify"):
        count_generation_flops(transformer, vae, TINY_SCHEDULE, rope_grid_hw(1.0), text_tokens=TEXT_TOKENS)


def test_meta_and_cpu_counts_agree():
    meta, cpu = _count_tiny("meta", True), _count_tiny("cpu", True)
    for key in ("text_flops", "transformer_flops", "vae_flops", "total_flops", "attention_core_flops"):
        assert meta[key] == cpu[key], key


# ---------------------------------------------------------------------------------------------------------------------
# (2) CFG doubles what runs on the doubled rows
# ---------------------------------------------------------------------------------------------------------------------
def test_cfg_doubles_transformer_flops():
    on, off = _count_tiny("meta", True), _count_tiny("meta", False)
    assert on["rows"] == 2 and off["rows"] == 1
    for s_on, s_off in zip(on["per_scale"], off["per_scale"]):
        assert s_on["blocks_flops"] == 2 * s_off["blocks_flops"]  # blocks run on 2B rows
        assert s_on["head_flops"] == 2 * s_off["head_flops"]  # head (and its AdaLN) on 2B rows vs B
        assert s_on["embed_flops"] == s_off["embed_flops"]  # word_embed runs on B rows, then repeated
    embed = sum(s["embed_flops"] for s in off["per_scale"])
    assert on["transformer_flops"] == 2 * off["transformer_flops"] - embed
    assert on["text_flops"] == 2 * off["text_flops"]  # cond + learned uncond text rows
    assert on["vae_flops"] == off["vae_flops"]  # B images decoded either way


# ---------------------------------------------------------------------------------------------------------------------
# (3) the script on the real 2B config, 1024x1024
# ---------------------------------------------------------------------------------------------------------------------
def _run_script(*args):
    return subprocess.run(
        [sys.executable, "-m", "diffusers_var_accel.lab.bench.flops", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )


@pytest.fixture(scope="module")
def infinity_2b_json():
    proc = _run_script("--model", "infinity-2b", "--height", "1024", "--width", "1024", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # exactly one JSON object on stdout


def test_script_json_infinity_2b_1024(infinity_2b_json):
    r = infinity_2b_json
    for key in (
        "total_tflops",
        "transformer_tflops",
        "vae_tflops",
        "text_tflops",
        "per_scale",
        "model",
        "height",
        "width",
        "cfg",
    ):
        assert key in r, key
    assert (r["model"], r["height"], r["width"], r["cfg"]) == ("infinity-2b", 1024, 1024, True)
    assert len(r["per_scale"]) == 13
    assert sum(s["tokens"] for s in r["per_scale"]) == 10521
    assert [(s["h"], s["w"]) for s in r["per_scale"]][-1] == (64, 64)
    # Sanity band: linear layers alone give 2 FLOPs x 28 C^2 (qkv 3, proj 1, cross q 1, cross proj 1, FFN 8, in MACs
    # C^2) x 32 blocks x 10521 tokens x 2 CFG rows = 79.1 TFLOPs (lower bound). Attention is at most full causal
    # attention over 10521 tokens, 4 C L^2 x 32 x 2 = 58 TFLOPs, and the decoder ~10: upper bound < 160.
    assert 79 < r["total_tflops"] < 160
    assert r["total_tflops"] == pytest.approx(r["transformer_tflops"] + r["vae_tflops"] + r["text_tflops"], rel=1e-9)
    assert r["reference"]["total_tflops"] == 101.58
    # Every scale of the real config matches the analytic count exactly.
    cfg = INFINITY_CONFIGS["infinity-2b"]
    text, scales = analytic_generation(cfg, [(1, s["h"], s["w"]) for s in r["per_scale"]], 1, True, r["text_tokens"])
    assert r["text_flops"] == text
    assert [s["flops"] for s in r["per_scale"]] == [s["total"] for s in scales]


# ---------------------------------------------------------------------------------------------------------------------
# (4) unsupported size
# ---------------------------------------------------------------------------------------------------------------------
def test_unsupported_size_fails_with_the_list():
    proc = _run_script("--height", "1000", "--width", "1000")
    assert proc.returncode != 0
    assert "1000x1000" in proc.stderr and "Supported" in proc.stderr and "1024x1024" in proc.stderr
    assert proc.stdout == ""


# =====================================================================================================================
# HART
# =====================================================================================================================
import diffusers_var_accel.lab.bench.flops as flops_module  # noqa: E402
from diffusers_var_accel.lab.bench.flops import (  # noqa: E402
    HART_PAPER_TFLOPS,
    compare_hart_methods,
    count_hart_flops,
    format_hart_comparison,
    hart_conventions,
)
from diffusers_var_accel.models.transformer_hart import HART_CONFIGS, llama_mlp_hidden_size  # noqa: E402

#: A tiny HART: 6 scales (the presets' negative scale indices need >= 5), 2 blocks, 4 diffusion steps.
HART_TINY = dict(
    depth=2,
    embed_dim=64,
    num_heads=4,
    mlp_ratio=4.0,
    context_tokens=8,
    context_dim=48,
    patch_nums=(1, 2, 3, 4, 6, 8),
    vocab_size=32,
    token_channels=8,
    diffusion_width=32,
    diffusion_depth=2,
    num_sampling_steps="4",
)
HART_TINY_TOKENIZER = dict(vocab_size=32, z_channels=8, ch=32, ch_mult=(1, 1))


def _tiny_hart(**kwargs):
    return count_hart_flops(transformer_config=HART_TINY, tokenizer_config=HART_TINY_TOKENIZER, **kwargs)


@pytest.fixture(scope="module")
def tiny_hart_baseline():
    return _tiny_hart()


@pytest.fixture(scope="module")
def hart_0_7b():
    return count_hart_flops("hart-0.7b")  # about 5 s on meta tensors


def analytic_hart(cfg, batch, cfg_on, steps):
    """HART written from ARCHITECTURE.md sections 3-5 (2 FLOPs per MAC of every matmul, attention included).

    Per block on L tokens of R rows attending to S keys (context + every earlier scale + this pass): qkv C->3C,
    QK^T + PV, proj C->C, gated MLP (gate, up C->F, down F->C). Scale 0's pass is the T context tokens; scale 0 is
    predicted from the last one. Head on the rows that guidance needs (t = 0 at scale 0: B rows; else 2B):
    head AdaLN (C->2C on the pooled context) + C->V per token. Embeddings: word_embed (Cv->C) on the B image rows
    of every later scale, level embedding (256->C->C) once per position. Diffusion head at the last scale: the
    condition's word_embed on the B rows of hard codes, then ``steps`` evaluations of the MLP on every row
    (2N under CFG, N without): input_proj, time_embed (256->W->W), cond_embed (C->W), per res-block adaLN (W->3W)
    and MLP (W->W->W), final adaLN (W->2W) and linear (W->2Cv).
    """
    C, N, T, Cv, V = cfg["embed_dim"], cfg["depth"], cfg["context_tokens"], cfg["token_channels"], cfg["vocab_size"]
    F, W = llama_mlp_hidden_size(C, cfg["mlp_ratio"]), cfg["diffusion_width"]
    R = 2 * batch if cfg_on else batch
    patch_nums = cfg["patch_nums"]
    scales, S = [], 0
    for si, pn in enumerate(patch_nums):
        L = T if si == 0 else pn * pn
        S += L
        blocks = N * (2 * R * L * C * 3 * C + 4 * R * L * S * C + 2 * R * L * C * C + 3 * 2 * R * L * C * F)
        head_rows = batch if (si == 0 or not cfg_on) else R
        out_tokens = 1 if si == 0 else L
        head = 2 * head_rows * C * 2 * C + 2 * head_rows * out_tokens * C * V
        embed = (0 if si == 0 else 2 * batch * L * Cv * C) + 2 * L * (256 * C + C * C)
        scales.append(dict(blocks=blocks, head=head, embed=embed, attention=N * 4 * R * L * S * C))
    L = patch_nums[-1] ** 2
    rows = R * L
    per_row = (
        Cv * W + 256 * W + W * W + C * W + cfg["diffusion_depth"] * (3 * W * W + 2 * W * W) + 2 * W * W + W * 2 * Cv
    )
    diffusion = 2 * batch * L * Cv * C + steps * 2 * rows * per_row
    text = 2 * R * T * cfg["context_dim"] * C
    return text, scales, diffusion


@pytest.mark.parametrize("cfg_on,batch", [(True, 1), (False, 2)])
def test_hart_tiny_counts_match_analytic(cfg_on, batch):
    r = _tiny_hart(guidance=cfg_on, batch_size=batch)
    text, scales, diffusion = analytic_hart(HART_TINY, batch, cfg_on, steps=4)
    assert r["rows"] == (2 * batch if cfg_on else batch)
    assert r["text_flops"] == text
    assert len(r["per_scale"]) == len(HART_TINY["patch_nums"])
    for counted, expected in zip(r["per_scale"], scales):
        si = counted["scale_index"]
        assert counted["blocks_flops"] == expected["blocks"], si  # one pass of every block, attention included
        assert counted["head_flops"] == expected["head"], si
        assert counted["attention_flops"] == expected["attention"], si
        assert counted["scheduler_flops"] == 0, si
    # the level embedding may run per pass or once for every position (the official way): compare the sum
    assert sum(s["embed_flops"] for s in r["per_scale"]) == sum(s["embed"] for s in scales)
    assert r["diffusion_flops"] == r["per_scale"][-1]["diffusion_flops"] == diffusion
    # f_hat updates: one 3x3 Phi conv (Cv -> Cv) at the final P x P size for every scale but the last
    P, Cv = HART_TINY["patch_nums"][-1], HART_TINY["token_channels"]
    assert r["codes_flops"] == (len(HART_TINY["patch_nums"]) - 1) * 2 * batch * P * P * Cv * Cv * 9
    assert r["vae_flops"] > 0
    assert r["total_flops"] == (
        r["text_flops"] + r["transformer_flops"] + r["diffusion_flops"] + r["codes_flops"] + r["vae_flops"]
    )
    assert r["transformer_flops"] == sum(s["blocks"] + s["head"] + s["embed"] for s in scales)
    assert (r["height"], r["width"]) == (16, 16)  # last patch number 8 x 2x tokenizer downsampling


def test_hart_cfg_doubles_rows(tiny_hart_baseline):
    on, off = tiny_hart_baseline, _tiny_hart(guidance=False)
    assert on["text_flops"] == 2 * off["text_flops"]
    assert on["diffusion_flops"] > 1.9 * off["diffusion_flops"]  # the MLP runs on 2N rows instead of N
    for s_on, s_off in zip(on["per_scale"], off["per_scale"]):
        assert s_on["blocks_flops"] == 2 * s_off["blocks_flops"]
        assert s_on["embed_flops"] == s_off["embed_flops"]  # B image rows, then repeated
    assert on["vae_flops"] == off["vae_flops"] and on["codes_flops"] == off["codes_flops"]


@pytest.mark.parametrize("accel", ["fastvar", "lazyvar", "depthvar:reference_scale=3", "arvar"])
def test_hart_accelerated_counts_are_lower(accel, tiny_hart_baseline):
    base, fast = tiny_hart_baseline, _tiny_hart(accel=accel)
    assert fast["accel"] == accel
    assert fast["total_flops"] < base["total_flops"]
    assert fast["transformer_flops"] < base["transformer_flops"]
    # the methods change the transformer passes; LazyVAR also runs the diffusion head on its kept tokens only
    for key in ("text_flops", "codes_flops", "vae_flops") + (() if accel == "lazyvar" else ("diffusion_flops",)):
        assert fast[key] == base[key], key
    if accel == "lazyvar":
        assert 0 < fast["diffusion_flops"] < 0.5 * base["diffusion_flops"]
    assert sum(s["flops"] for s in fast["per_scale"]) == fast["total_flops"] - fast["text_flops"] - fast["vae_flops"]


def test_hart_conventions_and_comparison_on_tiny(tiny_hart_baseline):
    base, fast = tiny_hart_baseline, _tiny_hart(accel="fastvar")
    comparison = compare_hart_methods(base, {"fastvar": fast})
    assert comparison["summary"][1]["ratio"] == pytest.approx(base["total_tflops"] / fast["total_tflops"])
    assert comparison["summary"][0]["paper_tflops"] is None  # a config override has no published number
    text = format_hart_comparison(comparison)
    assert "fastvar" in text and "diff. head" in text
    # attention counted under the conventions: the real count >= context + current pass >= current pass only
    cur = _tiny_hart(self_attention="current_pass")
    ctx = _tiny_hart(self_attention="context_and_current_pass")
    assert base["attention_core_flops"] > ctx["attention_core_flops"] > cur["attention_core_flops"] > 0
    for r in (cur, ctx):
        assert r["total_flops"] - r["attention_core_flops"] == base["total_flops"] - base["attention_core_flops"]
    comps = {
        m: dict(
            linear=r["transformer_tflops"] - r["attention_core_tflops"] + r["text_tflops"],
            self_attn_cache=r["attention_core_tflops"],
            self_attn_context_and_current_pass=0.0,
            self_attn_current_pass=0.0,
            diffusion=r["diffusion_tflops"],
            vae_decode=r["vae_tflops"] + r["codes_tflops"],
            total=r["total_tflops"],
        )
        for m, r in (("baseline", base), ("fastvar", fast))
    }
    rows = hart_conventions(comps)
    assert rows[0]["totals"]["baseline"] == pytest.approx(base["total_tflops"])
    assert all(row["saved"]["baseline"] == 0 for row in rows)


def test_hart_0_7b_matches_analytic(hart_0_7b):
    r = hart_0_7b
    cfg = HART_CONFIGS["hart-0.7b"]
    assert [s["tokens"] for s in r["per_scale"]][-1] == 4096 and sum(s["tokens"] for s in r["per_scale"]) == 9451
    assert r["per_scale"][-1]["kv_tokens"] == 9750  # 300 context tokens + the inputs of scales 1..13
    text, scales, diffusion = analytic_hart(cfg, 1, True, steps=8)
    assert r["text_flops"] == text
    assert [s["blocks_flops"] + s["head_flops"] for s in r["per_scale"]] == [s["blocks"] + s["head"] for s in scales]
    assert r["transformer_flops"] == sum(s["blocks"] + s["head"] + s["embed"] for s in scales)
    assert r["diffusion_flops"] == diffusion
    assert (r["height"], r["width"], r["text_tokens"]) == (1024, 1024, 300)
    assert r["reference"]["total_tflops"] == HART_PAPER_TFLOPS["hart-0.7b"]["baseline"] == 45.59
    # sanity band: linear layers alone are 2 x (4 C^2 + 3 C F) x 24 blocks x (9450 + 300) tokens x 2 rows = 26.5
    assert 50 < r["total_tflops"] < 60


def test_cli_hart_prints_a_table(hart_0_7b, monkeypatch, capsys):
    # The count itself is the fixture's (checked above); this checks the script's HART path and its table.
    import diffusers_var_accel.lab.bench.hart_flops as hart_flops  # the family's counter, which its CLI path runs

    calls = []
    monkeypatch.setattr(hart_flops, "count_hart_flops", lambda *a, **k: calls.append((a, k)) or hart_0_7b)
    assert flops_module.main(["--model", "hart-0.7b"]) == 0
    out = capsys.readouterr().out
    assert calls and calls[0][0][:3] == ("hart-0.7b", 1, True)
    assert "hart-0.7b  1024x1024" in out and "64x64" in out and "diffusion head (8 steps)" in out
    assert "tokenizer decoder" in out and "45.59" in out and "Qwen2" in out
    lines = out.splitlines()
    assert sum(1 for line in lines if line.lstrip().split(" |")[0].isdigit()) == 14  # one row per scale


def test_cli_hart_rejects_other_sizes(capsys):
    assert flops_module.main(["--model", "hart-0.7b", "--height", "512", "--width", "512"]) == 2
    captured = capsys.readouterr()
    assert "1024x1024" in captured.err and captured.out == ""


# =====================================================================================================================
# the meter itself: generic attribution, and no family named in its code
# =====================================================================================================================
def test_meter_steps_attributes_nested_steps_to_the_innermost_one():
    from diffusers_var_accel.lab.bench.flop_meter import FlopMeter, meter_steps

    class Steps:
        def outer(self, x):
            return self.inner(x @ x) @ x  # two matmuls of its own around the inner step

        def inner(self, x):
            return x @ x

    steps, mode = Steps(), make_flop_counter()
    parts = meter_steps(steps, {"outer": "a", "inner": "b"}, FlopMeter(mode))
    with mode:
        steps.outer(torch.zeros(4, 4, device="meta"))
    one = 2 * 4 * 4 * 4  # FLOPs of one 4x4 @ 4x4
    assert dict(parts) == {"a": 2 * one, "b": one}


def test_bench_flops_names_no_family_in_its_code():
    """Docstrings may name the families as examples; code (names, strings) may not."""
    import ast

    source = (REPO / "diffusers_var_accel" / "lab" / "bench" / "flops.py").read_text(encoding="utf-8")
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    words = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]
    words += [node.id for node in ast.walk(tree) if isinstance(node, ast.Name)]
    words += [node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)]
    words += [alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names]
    assert not [w for w in words if "hart" in w.lower() or "infinity" in w.lower()]


def test_key_value_source_hook_sees_every_self_attention_call():
    """The processors' public hook: the meter's view of the cache is what the self-attention stores and reads."""
    from diffusers_var_accel.lab.bench.flop_meter import CurrentPassKV, attend_to_current_pass

    transformer, vae = _tiny_models("meta")
    seen = []
    attend_to_current_pass(transformer)
    for module in transformer.modules():
        processor = getattr(module, "processor", None)
        if processor is not None:
            view = processor.key_value_source
            processor.key_value_source = lambda cache, view=view: seen.append(view(cache)) or seen[-1]
    result = count_generation_flops(transformer, vae, TINY_SCHEDULE, rope_grid_hw(1.0), text_tokens=TEXT_TOKENS)
    assert len(seen) == TINY["depth"] * len(TINY_SCHEDULE) and all(isinstance(v, CurrentPassKV) for v in seen)
    # current pass only: the self-attention core is 4 R L^2 C per block and scale (plus the text's, 4 R L T C)
    C, rows = TINY["embed_dim"], result["rows"]
    core = sum(TINY["depth"] * 4 * rows * (s[-2] * s[-1]) * (s[-2] * s[-1] + TEXT_TOKENS) * C for s in TINY_SCHEDULE)
    assert result["attention_core_flops"] == core


def test_flop_counter_is_importable_from_the_package():
    from diffusers_var_accel.lab.bench import flops

    assert callable(flops.main) and callable(flops.count_infinity_flops) and callable(flops.count_hart_flops)
    import diffusers_var_accel.lab.bench.flops as script

    assert script.main is flops.main and script.count_generation_flops is flops.count_generation_flops


def test_the_text_length_defaults_from_the_model_in_hand():
    """Without ``text_tokens`` an Infinity count takes a typical prompt's 32 tokens, capped by the model's
    ``text_maxlen`` (the embedded model takes 24): no error for a model with shorter text."""
    from diffusers_var_accel.lab.bench.infinity_flops import DEFAULT_TEXT_TOKENS

    transformer = build_on_meta(InfinityTransformer, **TINY)  # text_maxlen 16 < 32
    vae = build_on_meta(InfinityBSQVAE, **TINY_VAE)
    assert TINY["text_maxlen"] < DEFAULT_TEXT_TOKENS
    default = count_generation_flops(transformer, vae, TINY_SCHEDULE, rope_grid_hw(1.0))
    capped = count_generation_flops(
        transformer, vae, TINY_SCHEDULE, rope_grid_hw(1.0), text_tokens=TINY["text_maxlen"]
    )
    assert default["text_flops"] == capped["text_flops"] and default["total_flops"] == capped["total_flops"]
    with pytest.raises(ValueError, match="exceeds text_maxlen"):
        count_generation_flops(transformer, vae, TINY_SCHEDULE, rope_grid_hw(1.0), text_tokens=DEFAULT_TEXT_TOKENS)
