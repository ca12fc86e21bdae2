"""Tests of ``benchmarks/flops.py``: counted FLOPs against an analytic count written from the architecture notes.

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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.flops import build_on_meta, count_generation_flops  # noqa: E402
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
    tokens, recomputed every scale, as the official code), QK^T and PV over T keys; FFN C->F->C. Head: head AdaLN
    (C->2C on the pooled text, per row) and C->2d. Input embedding word_embed (d->C) runs on the B image rows only
    (the CFG rows are a repeat), and not at scale 0 (the start token is the pooled text).
    """
    C, d, N = cfg["embed_dim"], cfg["codebook_dim"], cfg["depth"]
    F = round(C * cfg["mlp_ratio"] / 256) * 256
    block = (
        2 * rows * L * C * 3 * C + 2 * rows * L * C * C  # self-attn projections
        + 4 * rows * L * S * C  # self-attn QK^T + PV (H heads x c = C)
        + 2 * rows * L * C * C + 2 * rows * T * C * 2 * C + 2 * rows * L * C * C  # cross q, text K/V, proj
        + 4 * rows * L * T * C  # cross QK^T + PV
        + 2 * rows * L * C * F * 2  # FFN
    )
    head = 2 * rows * C * 2 * C + 2 * rows * L * C * 2 * d
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
    return count_generation_flops(transformer, vae, TINY_SCHEDULE, rope_grid_hw(1.0), cfg=cfg_on, batch_size=batch,
                                  text_tokens=TEXT_TOKENS)


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
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / "flops.py"), *args], capture_output=True,
                          text=True, cwd=REPO, timeout=300)


@pytest.fixture(scope="module")
def infinity_2b_json():
    proc = _run_script("--model", "infinity-2b", "--height", "1024", "--width", "1024", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # exactly one JSON object on stdout


def test_script_json_infinity_2b_1024(infinity_2b_json):
    r = infinity_2b_json
    for key in ("total_tflops", "transformer_tflops", "vae_tflops", "text_tflops", "per_scale", "model", "height",
                "width", "cfg"):
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
