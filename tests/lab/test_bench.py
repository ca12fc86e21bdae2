"""``var-accel bench`` (``diffusers_var_accel.lab.bench``): metrics on known inputs, prompt sets, input checks, an
end-to-end run on the embedded model with injected LPIPS / FID feature functions, and the reporting of skipped metrics.

Nothing here asserts on wall-clock values; times are only checked for their bookkeeping (counts, ratios of 1).
"""

import json
import math
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from diffusers_var_accel.lab.bench import (
    GENEVAL_METADATA_PATH,
    MetricUnavailable,
    fid_star,
    frechet_distance,
    load_fid_extractor,
    load_lpips,
    load_prompt_set,
    parse_methods,
    parse_seeds,
    run_bench,
)
from diffusers_var_accel.lab import metrics as bench_metrics
from diffusers_var_accel.lab.bench import runner
from diffusers_var_accel.lab.bench.probe import PeakMemory
from diffusers_var_accel.lab.bench.prompts import select_evenly
from diffusers_var_accel.lab.bench.runner import check_methods, method_folders
from diffusers_var_accel.lab.cli import DEFAULT_BENCH_METHODS, main
from diffusers_var_accel.embedded import EMBEDDED_SAMPLING
from diffusers_var_accel.lab.metrics import psnr, ssim


# ---------------------------------------------------------------------------------------------------------------------
# metrics on known inputs
# ---------------------------------------------------------------------------------------------------------------------
def test_identical_uint8_images_give_infinite_psnr_and_unit_ssim():
    image = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    assert math.isinf(float(psnr(image, image)))
    assert float(ssim(image, image)) == pytest.approx(1.0, abs=1e-12)


def test_a_known_shift_gives_the_known_psnr():
    image = np.full((16, 16, 3), 100, dtype=np.uint8)
    shifted = image + np.uint8(10)  # MSE (10/255)^2 -> 20 log10(25.5) dB
    assert float(psnr(shifted, image)) == pytest.approx(20 * math.log10(25.5), abs=1e-9)
    assert float(ssim(shifted, image)) < 1.0


def _projection(dims: int = 16, seed: int = 0):
    """A fixed random projection of 8x8-pooled images: a stand-in feature extractor."""
    weight = torch.randn(3 * 8 * 8, dims, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)

    def extract(images_BCHW: torch.Tensor) -> torch.Tensor:
        pooled = torch.nn.functional.adaptive_avg_pool2d(images_BCHW.double(), 8)
        return pooled.flatten(1) @ weight

    return extract


def test_fid_star_of_a_set_against_itself_is_zero_with_an_injected_extractor():
    images = torch.rand(12, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    other = torch.rand(12, 3, 32, 32, generator=torch.Generator().manual_seed(2)).pow(2)
    extractor = _projection()
    assert fid_star(images, images, feature_extractor=extractor) == pytest.approx(0.0, abs=1e-8)
    assert fid_star(list(images.unbind(0)), images, feature_extractor=extractor) == pytest.approx(0.0, abs=1e-8)
    assert fid_star(other, images, feature_extractor=extractor) > 1e-3


def test_frechet_distance_matches_closed_forms():
    feats = torch.randn(200, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    shift = torch.tensor([1.0, -2.0, 0.5, 0.0, 3.0, 1.5], dtype=torch.float64)
    # same covariance, shifted mean: the distance is |shift|^2
    assert frechet_distance(feats + shift, feats) == pytest.approx(float(shift.pow(2).sum()), rel=1e-9)
    # doubled features: |mu|^2 + tr(S) + tr(4 S) - 2 tr(2 S) = |mu|^2 + tr(S)
    expected = float(feats.mean(0).pow(2).sum() + torch.cov(feats.T).trace())
    assert frechet_distance(2 * feats, feats) == pytest.approx(expected, rel=1e-9)
    # more dimensions than vectors (singular covariances) still gives a finite value, 0 against itself
    few = torch.randn(5, 40, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    assert frechet_distance(few, few) == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError, match="at least 2"):
        frechet_distance(feats[:1], feats)
    with pytest.raises(ValueError, match="feature sizes differ"):
        frechet_distance(feats, feats[:, :3])


def test_standard_networks_are_never_downloaded(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    real_find_spec = bench_metrics.importlib.util.find_spec
    # package missing -> the reason names the package
    monkeypatch.setattr(bench_metrics.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(MetricUnavailable, match="pytorch_fid"):
        load_fid_extractor()
    with pytest.raises(MetricUnavailable, match="lpips package"):
        load_lpips()
    with pytest.raises(MetricUnavailable, match="pytorch_fid"):
        fid_star(torch.rand(2, 3, 8, 8), torch.rand(2, 3, 8, 8))
    # package present but weights not in the (empty) torch hub cache -> the reason names the weights file
    spec = real_find_spec("json")
    monkeypatch.setattr(bench_metrics.importlib.util, "find_spec", lambda name: spec)
    with pytest.raises(MetricUnavailable, match="pt_inception-2015-12-05-6726825d.pth.*not downloaded"):
        load_fid_extractor()
    with pytest.raises(MetricUnavailable, match="alexnet-owt-7be5be79.pth.*not downloaded"):
        load_lpips()
    assert not (tmp_path / "hub").exists()


def test_peak_memory_is_per_call_on_a_linux_cpu():
    meter = PeakMemory(torch.device("cpu"))
    if meter.kind is None:
        pytest.skip(meter.unavailable)
    meter.start()
    block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    peak, increase = meter.stop()
    assert increase >= 48 * 2**20 and peak >= increase
    del block
    meter.start()
    _, small_increase = meter.stop()
    assert small_increase < 48 * 2**20  # the earlier peak does not leak into this call


# ---------------------------------------------------------------------------------------------------------------------
# prompt sets and inputs
# ---------------------------------------------------------------------------------------------------------------------
def test_prompt_sets(tmp_path):
    shapes = load_prompt_set("shapes")
    assert len(shapes) == 24 and not shapes.geneval
    assert len({p.category for p in shapes.prompts}) == 6  # round robin over the six categories
    geneval = load_prompt_set("geneval")
    assert geneval.total == len(geneval) == 553 and geneval.geneval
    first = GENEVAL_METADATA_PATH.read_text().splitlines()[0]
    assert geneval.prompts[0].metadata_line == first and geneval.prompts[0].category == "single_object"
    assert (GENEVAL_METADATA_PATH.parent / "LICENSE").read_text().startswith("MIT License")
    subset = load_prompt_set("geneval", 10)
    assert [p.index for p in subset.prompts] == select_evenly(10, 553) and subset.prompts[-1].index > 490
    assert len({p.category for p in subset.prompts}) >= 5  # spread over the sorted categories

    (tmp_path / "p.txt").write_text("a red fox\n\n  a lighthouse at dusk  \n")
    assert [p.prompt for p in load_prompt_set(str(tmp_path / "p.txt")).prompts] == [
        "a red fox",
        "a lighthouse at dusk",
    ]
    (tmp_path / "mjhq.json").write_text(
        json.dumps(
            {"a1": {"prompt": "a cat", "category": "animals"}, "b2": {"prompt": "a city", "category": "people"}}
        )
    )
    mjhq = load_prompt_set(str(tmp_path / "mjhq.json"))
    assert [(p.prompt, p.category) for p in mjhq.prompts] == [
        ("a cat", "animals"),
        ("a city", "people"),
    ] and not mjhq.geneval
    (tmp_path / "plain.jsonl").write_text('{"prompt": "a cat"}\n"a dog"\n')
    plain = load_prompt_set(str(tmp_path / "plain.jsonl"))
    assert [p.prompt for p in plain.prompts] == ["a cat", "a dog"] and not plain.geneval

    with pytest.raises(FileNotFoundError, match="nope.jsonl.*shapes"):
        load_prompt_set(str(tmp_path / "nope.jsonl"))
    with pytest.raises(ValueError, match="600 prompts but geneval has 553"):
        load_prompt_set("geneval", 600)
    (tmp_path / "bad.jsonl").write_text('{"text": "no prompt key"}\n')
    with pytest.raises(ValueError, match="line 1"):
        load_prompt_set(str(tmp_path / "bad.jsonl"))


def test_seeds_methods_and_folders():
    assert parse_seeds("0") == [0] and parse_seeds("0-3,10") == [0, 1, 2, 3, 10] and parse_seeds([5, 7]) == [5, 7]
    for bad, why in (
        ("1,x", "'x' is not a seed"),
        ("3-1", "ends before"),
        ("1,1", "repeated"),
        ("-1", "not a seed"),
        ("", "not a seed"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_seeds(bad)
    assert parse_methods("lazyvar,fastvar:skip_last_scales=false,prune_ratios=[0.2,0.3]") == [
        "baseline",
        "lazyvar",
        "fastvar:skip_last_scales=false,prune_ratios=[0.2,0.3]",
    ]
    assert parse_methods("fastvar,baseline") == ["baseline", "fastvar"]
    with pytest.raises(ValueError, match="given twice"):
        parse_methods("lazyvar,lazyvar")
    check_methods(["baseline", "fastvar:skip_last_scales=false", "lazyvar", "depthvar", "arvar"])
    with pytest.raises(ValueError, match=r"unknown method 'fastvr'.*'fastvar'.*'lazyvar'"):  # lists what is allowed
        check_methods(["baseline", "fastvr"])
    with pytest.raises(ValueError, match="missing/scheduler"):
        check_methods(["baseline", "missing/scheduler"])
    with pytest.raises(ValueError, match="no such scheduler JSON file"):
        check_methods(["baseline", "missing/acceleration_config.json"])
    with pytest.raises(ValueError, match="unknown method 'lazyvar:no_such_setting=1'"):
        check_methods(["baseline", "lazyvar:no_such_setting=1"])
    folders = method_folders(
        [
            "baseline",
            "fastvar:skip_last_scales=false",
            "a/b/acceleration_config.json",
            "x/b.json",
            "lazyvar",
            "infinity-2b/lazyvar",
        ]
    )
    assert folders == {
        "baseline": "baseline",
        "fastvar:skip_last_scales=false": "fastvar-skip_last_scales-false",
        "a/b/acceleration_config.json": "b",
        "x/b.json": "b-2",
        "lazyvar": "lazyvar",
        "infinity-2b/lazyvar": "infinity-2b-lazyvar",
    }
    assert tuple(runner.DEFAULT_METHODS) == DEFAULT_BENCH_METHODS


def test_cli_rejects_bad_input_with_a_clear_message(tmp_path, capsys):
    out = str(tmp_path / "out")
    assert main(["bench", "--methods", "baseline,fastvr", "--output", out]) == 2
    err = capsys.readouterr().err
    assert "unknown method 'fastvr'" in err and "lazyvar" in err
    assert main(["bench", "--prompts", str(tmp_path / "missing.jsonl"), "--output", out]) == 2
    assert "missing.jsonl" in capsys.readouterr().err
    assert main(["bench", "--seeds", "0,a", "--output", out]) == 2
    assert "bad seeds '0,a'" in capsys.readouterr().err
    assert main(["bench", "--repeats", "0", "--output", out]) == 2
    assert "repeats must be an integer >= 1" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------------------------------
# end to end on the embedded model
# ---------------------------------------------------------------------------------------------------------------------
GENEVAL_STYLE_LINES = [
    {"tag": "counting", "include": [{"class": "circle", "count": 2}], "prompt": "two red circles"},
    {
        "tag": "position",
        "include": [{"class": "square", "count": 1}, {"class": "triangle", "count": 1, "position": ["left of", 0]}],
        "prompt": "a blue square to the left of a yellow triangle",
    },
]


def _mean_abs_difference(images: torch.Tensor, references: torch.Tensor) -> torch.Tensor:
    return (images - references).abs().flatten(1).mean(1)


def _strict_json(path):
    def refuse(constant):
        raise AssertionError(f"non-standard JSON constant {constant}")

    return json.loads(path.read_text(), parse_constant=refuse)


@pytest.fixture(scope="module")
def embedded_pipe():
    from diffusers_var_accel.pipelines.pipeline_loading import load_embedded_pipeline

    return load_embedded_pipeline()


@pytest.fixture(scope="module")
def bench_run(embedded_pipe, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    prompts = out / "geneval_style.jsonl"
    prompts.write_text("".join(json.dumps(line) + "\n" for line in GENEVAL_STYLE_LINES))
    results = run_bench(
        pipe=embedded_pipe,
        prompts=str(prompts),
        seeds="0,1",
        methods="baseline,lazyvar",
        repeats=2,
        warmup=1,
        output_dir=out / "run",
        progress=False,
        fid_feature_extractor=_projection(),
        lpips_fn=_mean_abs_difference,
        verbose=False,
    )
    return results, out / "run", prompts


def embedded_kv_bytes(results):
    """The baseline's cache, from the shapes: 2 CFG rows, every scale but the last, K and V, every layer, fp32."""
    from diffusers_var_accel import InfinityPipeline

    pipe = InfinityPipeline.from_pretrained("embedded")
    schedule = pipe.scale_schedule_for(64, 64)[0]
    positions = sum(h * w for _, h, w in schedule[:-1])
    config = pipe.transformer.config
    return 2 * len(pipe.transformer.blocks) * 2 * positions * config.embed_dim * 4


def test_bench_writes_the_json_table_plots_and_geneval_layout(bench_run):
    results, out, prompts = bench_run
    saved = _strict_json(out / "results.json")
    assert saved["methods"].keys() == results["methods"].keys() == {"baseline", "lazyvar"}
    assert saved["items"][0]["methods"]["baseline"]["psnr"] == "inf"  # strict JSON: an infinite PSNR is a string
    assert (
        saved["methods"]["lazyvar"]["fidelity"]["psnr_mean"] == results["methods"]["lazyvar"]["fidelity"]["psnr_mean"]
    )
    table = (out / "results.md").read_text()
    assert "| method | s / image (median)" in table and "| lazyvar |" in table and "FID*" in table
    for name in ("speedup_vs_fidelity.png", "scale_breakdown.png", "grid.png"):
        assert Image.open(out / name).size[0] > 100
    lines = prompts.read_text().splitlines()
    for method in ("baseline", "lazyvar"):
        for index in range(2):
            folder = out / method / "geneval" / f"{index:05d}"
            assert (folder / "metadata.jsonl").read_text() == lines[index] + "\n"
            assert sorted(p.name for p in (folder / "samples").iterdir()) == ["0000.png", "0001.png"]
    run = results["run"]
    assert run["geneval_layout"] and run["num_items"] == 4 and run["seeds"] == [0, 1] and run["num_processes"] == 1
    assert run["model"] == "embedded" and all(
        run["sampling"][k] == v for k, v in EMBEDDED_SAMPLING.items()
    )  # its settings
    assert (run["height"], run["width"]) == (64, 64)
    # the KV cache of one call, counted from the plan: the embedded model runs with CFG (guidance 2); a LazyVAR group
    # decoded in one pass keeps fewer positions than the baseline, one decoded scale by scale keeps a buffer as large
    kv = {m: results["methods"][m]["kv_cache_bytes"] for m in ("baseline", "lazyvar")}
    assert kv["baseline"] == embedded_kv_bytes(results) and 0 < kv["lazyvar"] <= kv["baseline"]
    if embedded_lazyvar_preset()["parallel_decoding"]:
        assert kv["lazyvar"] < kv["baseline"]
    assert "KV cache MB" in table


def test_bench_fidelity_matches_the_saved_images(bench_run):
    results, out, _ = bench_run
    items = results["items"]
    assert [(it["prompt_index"], it["seed"]) for it in items] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    features = {m: [] for m in ("baseline", "lazyvar")}
    for it in items:
        loaded = {
            m: np.asarray(
                Image.open(
                    out / m / "geneval" / f"{it['prompt_index']:05d}" / "samples" / f"{it['seed_position']:04d}.png"
                )
            )
            for m in features
        }
        base = it["methods"]["baseline"]
        assert math.isinf(base["psnr"]) and base["ssim"] == pytest.approx(1.0) and base["lpips"] == 0.0
        lazy = it["methods"]["lazyvar"]
        assert lazy["psnr"] == pytest.approx(float(psnr(loaded["lazyvar"], loaded["baseline"])))
        assert lazy["ssim"] == pytest.approx(float(ssim(loaded["lazyvar"], loaded["baseline"])))
        expected_l1 = np.abs(loaded["lazyvar"].astype(np.float64) - loaded["baseline"].astype(np.float64)).mean() / 255
        assert lazy["lpips"] == pytest.approx(expected_l1, rel=1e-5)
        for m in features:
            tensor = torch.from_numpy(loaded[m].copy()).permute(2, 0, 1)[None].float() / 255
            features[m].append(_projection()(tensor)[0])
            assert it["methods"][m]["scorer_correct"] in (True, False)
    fidelity = {m: results["methods"][m]["fidelity"] for m in features}
    assert fidelity["baseline"]["fid_star"] == pytest.approx(0.0, abs=1e-6)
    expected_fid = frechet_distance(torch.stack(features["lazyvar"]), torch.stack(features["baseline"]))
    assert fidelity["lazyvar"]["fid_star"] == pytest.approx(expected_fid, rel=1e-5)
    assert fidelity["baseline"]["identical_images"] == 4 and fidelity["baseline"]["psnr_mean"] == math.inf
    assert "fid_star" not in results["skipped"] and "lpips" not in results["skipped"]


def embedded_lazyvar_preset() -> dict:
    """The packaged ``embedded/lazyvar`` setting that the bench's ``lazyvar`` runs on the embedded model."""
    from diffusers_var_accel import LazyVARScheduler

    return dict(LazyVARScheduler.from_pretrained("embedded/lazyvar").config)


def test_bench_timing_flops_and_scorer_bookkeeping(bench_run):
    results, _, _ = bench_run
    base, lazy = results["methods"]["baseline"], results["methods"]["lazyvar"]
    for r in (base, lazy):
        assert r["seconds_per_image"]["n"] == 4 * 2  # 4 images x 2 repeats
        assert r["seconds_per_image"]["min"] <= r["seconds_per_image"]["median"] <= r["seconds_per_image"]["max"]
        assert all(len(it["methods"][r["spec"]]["seconds_per_image"]) == 2 for it in results["items"])
        per_scale = r["per_scale"]
        assert len(per_scale["seconds"]) == len(per_scale["flops"]) == len(results["run"]["scale_schedule"])
        assert sum(per_scale["flops"]) / 1e9 == pytest.approx(r["flops"]["transformer_gflops"])
        assert r["peak_memory"]["kind"] in ("peak_rss", None)
        assert r["scorer"]["n"] == 4 and set(r["scorer"]["per_category"]) <= {"counting", "position"}
    assert base["speedup"] == 1.0 and base["flops"]["ratio"] == 1.0
    assert lazy["flops"]["transformer_gflops"] < base["flops"]["transformer_gflops"]
    for part in ("vae_gflops", "text_encoder_gflops"):  # the same decoder and text encoder run for every method
        assert base["flops"][part] > 0
        assert lazy["flops"][part] == pytest.approx(base["flops"][part])
    assert lazy["flops"]["ratio"] > 1
    preset = embedded_lazyvar_preset()
    group = [len(base["per_scale"]["flops"]) + k for k in preset["group_scales"]]
    if preset["parallel_decoding"]:  # the group in one pass: only its first scale has FLOPs
        assert lazy["per_scale"]["flops"][-1] == 0 and base["per_scale"]["flops"][-1] > 0
    else:  # scale by scale: every grouped scale runs its kept tokens only
        assert all(0 < lazy["per_scale"]["flops"][i] < base["per_scale"]["flops"][i] for i in group)


def test_bench_reports_skipped_metrics_and_plain_image_layout(embedded_pipe, tmp_path, monkeypatch):
    def unavailable(device):
        raise MetricUnavailable("weights not in this machine's cache (test)")

    monkeypatch.setattr(runner, "load_fid_extractor", unavailable)
    monkeypatch.setattr(runner, "load_lpips", unavailable)
    (tmp_path / "prompts.txt").write_text("a red fox in the snow\n")
    results = run_bench(
        pipe=embedded_pipe,
        prompts=str(tmp_path / "prompts.txt"),
        seeds=[7],
        methods=["baseline"],
        repeats=1,
        warmup=0,
        output_dir=tmp_path / "out",
        progress=False,
        verbose=False,
    )
    assert (
        results["skipped"]["fid_star"] == results["skipped"]["lpips"] == "weights not in this machine's cache (test)"
    )
    assert "shapes grammar" in results["skipped"]["scorer"]
    fidelity = results["methods"]["baseline"]["fidelity"]
    assert fidelity["fid_star"] is None and fidelity["lpips_mean"] is None
    assert results["methods"]["baseline"]["scorer"]["accuracy"] is None
    saved = _strict_json(tmp_path / "out" / "results.json")
    assert saved["methods"]["baseline"]["fidelity"]["lpips_mean"] is None
    assert saved["skipped"]["lpips"].startswith("weights not")
    assert (tmp_path / "out" / "baseline" / "images" / "00000-s7.png").is_file()
    assert "weights not in this machine's cache" in (tmp_path / "out" / "results.md").read_text()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


def test_the_benchmark_takes_a_composition_by_name():
    from diffusers_var_accel.lab.bench.runner import check_methods

    check_methods(["baseline", "lazyvar+arvar"])
    with pytest.raises(ValueError, match="unknown method 'lazyvar\\+nope'"):
        check_methods(["lazyvar+nope"])


def test_run_bench_takes_a_settings_object_and_refuses_an_unknown_setting(embedded_pipe, tmp_path):
    from diffusers_var_accel.lab.bench import BenchSettings

    settings = BenchSettings(
        num_prompts=1, methods="baseline", repeats=1, warmup=0, output_dir=tmp_path / "a", progress=False
    )
    off = dict(fid_feature_extractor=None, lpips_fn=None)
    by_object = run_bench(settings, pipe=embedded_pipe, save_images=False, verbose=False, **off)
    by_keywords = run_bench(
        pipe=embedded_pipe,
        num_prompts=1,
        methods="baseline",
        repeats=1,
        warmup=0,
        output_dir=tmp_path / "b",
        progress=False,
        save_images=False,
        verbose=False,
        **off,
    )
    timed = lambda run: [{**i, "methods": {m: v["sha256"] for m, v in i["methods"].items()}} for i in run["items"]]  # noqa: E731
    assert timed(by_object) == timed(by_keywords)  # the same items and images; only the timings differ
    assert settings.save_images is True  # an override replaces a copy's field, not the caller's object
    with pytest.raises(TypeError, match=r"unknown settings \['num_promts'\]; allowed: \['model'"):
        run_bench(pipe=embedded_pipe, num_promts=1)
