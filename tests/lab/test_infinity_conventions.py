"""``var-accel flops --model infinity-... --conventions``: each convention is the sum of counted parts that
docs/flops.md states above its table. The rules are checked on made-up components (every part a different value, so
a wrong part or a missing term changes the total); the command line on the same components, its counts replaced (a
real Infinity-2B conventions count takes minutes: ``python scripts/docs_tables.py record conventions_infinity_2b``).
"""

from __future__ import annotations

import json

import pytest

from diffusers_var_accel.lab.bench import flops as flops_cli
from diffusers_var_accel.lab.bench import infinity_flops as inf


def fake_components(method: str, cfg: bool = True, text_tokens: int = 32, batch_size: int = 1, **_) -> dict:
    """Components shaped as ``flops_components``' output; the parts differ by method, text length and CFG."""
    m = {"baseline": 0, "fastvar": 1, "lazyvar": 2}[method]
    rows = (2 if cfg else 1) * batch_size
    text = 0.001 * rows * (1 + text_tokens / 512)
    text_kv = 0.002 * rows * text_tokens / 32
    cross = 0.005 * rows * text_tokens / 32 / (1 + m)
    linear = rows * (40.0 - 12.0 * m) + text + text_kv
    cache, current = rows * (18.0 - 7.0 * m), rows * (11.0 - 4.0 * m)
    transformer = linear - text + cache + cross
    scales = [dict(scale_index=0, h=1, w=1, tokens=1), dict(scale_index=1, h=2, w=2, tokens=4)]
    per_scale = [
        dict(**scales[0], tflops=0.5 + m, attention=0.25, current_pass=0.375 + m),
        dict(**scales[1], tflops=0.0 if m else 3.0, attention=0.0 if m else 1.5, current_pass=0.0 if m else 2.0),
    ]
    return dict(
        accel=None if method == "baseline" else method,
        cfg=cfg,
        text_tokens=text_tokens,
        linear=linear,
        self_attn_cache=cache,
        self_attn_current_pass=current,
        cross_attn_core=cross,
        vae_decode=9.75,
        total=transformer + text + 9.75,
        text=text,
        transformer=transformer,
        text_kv=text_kv,
        passes=13 - 2 * m,
        per_scale=per_scale,
    )


METHODS = ("baseline", "fastvar", "lazyvar")
T5 = {1: 1.25, 2: 2.5}


def settings():
    return (
        {m: fake_components(m) for m in METHODS},
        {m: fake_components(m, text_tokens=512) for m in METHODS},
        {m: fake_components(m, cfg=False) for m in METHODS},
    )


def expected_totals(c, p, n):
    """docs/flops.md's rules, written out part by part (c: CFG at 32 tokens, p: at 512, n: no CFG)."""

    def current(x):
        return x["linear"] + x["self_attn_current_pass"] + x["cross_attn_core"] + x["vae_decode"]

    def recomputed_kv(x):
        return (x["passes"] - 1) * x["text_kv"]

    return {
        "real": c["total"],
        "b": c["total"] - c["vae_decode"],
        "a": current(c),
        "a+b": c["linear"] + c["self_attn_current_pass"] + c["cross_attn_core"],
        "a'": c["linear"] + c["vae_decode"],
        "a'+b": c["linear"],
        "a'+t5": c["linear"] + c["vae_decode"] + T5[1],
        "a'+padded": p["linear"] + p["vae_decode"],
        "a'+padded+t5": p["linear"] + p["vae_decode"] + T5[1],
        "a'+padded+t5x2": p["linear"] + p["vae_decode"] + T5[2],
        "a+padded+t5x2": current(p) + T5[2],
        "real+padded": p["total"],
        "real+padded+t5x2": p["total"] + T5[2],
        "no_cfg": n["total"],
        "no_cfg+a": current(n),
        "macs": c["total"] / 2,
        "a'+kv": c["linear"] + c["vae_decode"] + recomputed_kv(c),
        "a'+kv+padded+t5": p["linear"] + p["vae_decode"] + recomputed_kv(p) + T5[1],
        "a'+kv+padded+t5x2": p["linear"] + p["vae_decode"] + recomputed_kv(p) + T5[2],
    }


def test_each_convention_is_its_sum_of_counted_parts():
    cfg, padded, no_cfg = settings()
    rows = inf.infinity_conventions(cfg, padded, no_cfg, T5)
    expected = {m: expected_totals(cfg[m], padded[m], no_cfg[m]) for m in METHODS}
    assert [r["key"] for r in rows] == list(expected["baseline"])
    assert rows[0]["convention"].startswith("real count:") and "32 text tokens" in rows[0]["convention"]
    for row in rows:
        assert list(row["totals"]) == list(METHODS)
        for m in METHODS:
            total = expected[m][row["key"]]
            assert row["totals"][m] == pytest.approx(total, rel=1e-12), (row["key"], m)
            assert row["saved"][m] == pytest.approx(expected["baseline"][row["key"]] - total, abs=1e-12)
            assert row["ratios"][m] == pytest.approx(expected["baseline"][row["key"]] / total, rel=1e-12)
    # the recomputed text K/V adds (passes - 1) passes' worth: 12, 10 and 8 of them here
    kv = {r["key"]: r for r in rows}
    assert kv["a'+kv"]["totals"]["lazyvar"] - kv["a'"]["totals"]["lazyvar"] == pytest.approx(8 * 0.004)


def test_gap_rows_change_one_assumption_of_the_baseline():
    cfg, padded, no_cfg = settings()
    c, p, n = cfg["baseline"], padded["baseline"], no_cfg["baseline"]
    gap = {r["key"]: r["tflops"] for r in inf.infinity_gap_to_paper(c, p, n, T5)}
    current = c["linear"] + c["self_attn_current_pass"] + c["cross_attn_core"] + c["vae_decode"]
    assert gap == pytest.approx(
        {
            "real": c["total"],
            "macs": c["total"] / 2,
            "no_cfg": n["total"],
            "transformer": c["total"] - c["vae_decode"] - c["text"],
            "padded": p["total"],
            "t5": c["total"] + T5[1],
            "kv": c["total"] + 12 * c["text_kv"],
            "a'": c["linear"] + c["vae_decode"],
            "attention_macs": c["total"] - (c["self_attn_cache"] + c["cross_attn_core"]) / 2,
            "a": current,
            "a_transformer": current - c["vae_decode"] - c["text"],
        },
        rel=1e-12,
    )


def test_per_scale_parts_and_transformer_totals():
    cfg, _, _ = settings()
    out = inf.infinity_per_scale_conventions(cfg)
    first, second = out["per_scale"]
    assert (first["h"], first["w"], first["tokens"], second["tokens"]) == (1, 1, 1, 4)
    assert first["real"] == {"baseline": 0.5, "fastvar": 1.5, "lazyvar": 2.5}
    assert first["current_pass"] == {"baseline": 0.375, "fastvar": 1.375, "lazyvar": 2.375}
    assert first["no_attention"] == {"baseline": 0.25, "fastvar": 1.25, "lazyvar": 2.25}
    assert second["no_attention"] == {"baseline": 1.5, "fastvar": 0.0, "lazyvar": 0.0}
    b = cfg["baseline"]
    assert out["transformer"]["current_pass"]["baseline"] == pytest.approx(
        b["linear"] - b["text"] + b["self_attn_current_pass"] + b["cross_attn_core"]
    )
    assert out["transformer"]["no_attention"]["baseline"] == pytest.approx(b["linear"] - b["text"])
    assert out["transformer"]["real"]["fastvar"] == cfg["fastvar"]["transformer"]


@pytest.fixture
def counted_by_fakes(monkeypatch):
    calls = []

    def components(model_name, height, width, accel=None, cfg=True, text_tokens=32, batch_size=1):
        calls.append((model_name, height, width, accel, cfg, text_tokens, batch_size))
        return fake_components(accel or "baseline", cfg=cfg, text_tokens=text_tokens, batch_size=batch_size)

    monkeypatch.setattr(inf, "flops_components", components)
    monkeypatch.setattr(inf, "count_t5_encoder_flops", lambda tokens, rows: int(T5[rows] * 1e12 * tokens / 512))
    return calls


def test_cli_conventions_json_and_text(counted_by_fakes, capsys):
    args = ["--model", "infinity-2b", "--height", "1024", "--width", "1024", "--accel", "fastvar,lazyvar"]
    assert flops_cli.main([*args, "--conventions", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # three settings (CFG at 32 and 512 text tokens, no CFG) for the baseline and each method
    counted = [(a, cfg, t) for _, _, _, a, cfg, t, _ in counted_by_fakes]
    assert len(counted) == 9 and set(counted) == {
        (a, cfg, t) for a in (None, "fastvar", "lazyvar") for cfg, t in ((True, 32), (True, 512), (False, 32))
    }
    assert (out["model"], out["cfg"], out["text_tokens"], out["padded_text_tokens"]) == ("infinity-2b", True, 32, 512)
    assert out["paper"] == {"baseline": 101.58, "fastvar": 44.15, "lazyvar": 34.32}
    assert out["passes"] == {"baseline": 13, "fastvar": 11, "lazyvar": 9}
    cfg, padded, no_cfg = settings()
    assert out["conventions"] == json.loads(json.dumps(inf.infinity_conventions(cfg, padded, no_cfg, T5)))
    assert [r["key"] for r in out["gap"]][:3] == ["real", "macs", "no_cfg"]
    assert len(out["per_scale"]) == 2 and set(out["transformer"]) == {"real", "current_pass", "no_attention"}
    assert flops_cli.main([*args, "--conventions"]) == 0
    text = capsys.readouterr().out
    assert "(a') + per-pass text K/V + 512 text tokens + (c) T5, 2 rows" in text and "papers" in text


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--no-cfg"], "--no-cfg does not apply"),
        (["--t5-tokens", "77"], "--t5-tokens 77 does not apply"),
        (["--accel", "nosuchmethod"], "nosuchmethod"),
    ],
)
def test_cli_conventions_refuses_what_it_would_ignore(counted_by_fakes, capsys, extra, message):
    assert flops_cli.main(["--model", "infinity-2b", "--conventions", *extra]) == 2
    assert message in capsys.readouterr().err
    assert counted_by_fakes == []  # refused before counting anything


def test_the_docs_record_recounts_its_t5_and_its_rows_agree():
    """The record docs/flops.md's tables are generated from (``conventions_infinity_2b``): its T5 counts are counted
    again (cheap on meta tensors), and its rows are consistent sums: the T5 rows add exactly that count, the gap
    rows are the candidate rows' baseline, the per-scale parts add up to the transformer totals."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "docs" / "counts" / "conventions_infinity_2b.json"
    out = json.loads(path.read_text())["output"]
    assert out["t5_tflops"] == {str(r): inf.count_t5_encoder_flops(512, r) / 1e12 for r in (1, 2)}
    rows = {r["key"]: r["totals"] for r in out["conventions"]}
    for m in ("baseline", "fastvar", "lazyvar"):
        assert rows["a'+t5"][m] - rows["a'"][m] == pytest.approx(out["t5_tflops"]["1"], abs=1e-9)
        assert rows["a'+padded+t5x2"][m] - rows["a'+padded"][m] == pytest.approx(out["t5_tflops"]["2"], abs=1e-9)
        assert rows["macs"][m] == rows["real"][m] / 2
        for key in ("real", "current_pass", "no_attention"):
            per_scale = sum(s[key][m] for s in out["per_scale"])
            assert per_scale == pytest.approx(out["transformer"][key][m], abs=1e-9), (key, m)
    gap = {r["key"]: r["tflops"] for r in out["gap"]}
    assert (gap["real"], gap["no_cfg"], gap["a'"], gap["a"]) == (
        rows["real"]["baseline"],
        rows["no_cfg"]["baseline"],
        rows["a'"]["baseline"],
        rows["a"]["baseline"],
    )
    assert out["passes"] == {"baseline": 13, "fastvar": 11, "lazyvar": 10}
