"""Model cards of converted pipeline folders: metadata, presets, benchmark numbers, usage snippet; the thin script.

The card only reads model_index.json (and the packaged presets), so the folders here hold just that file."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest
from huggingface_hub import ModelCard

import registry_lists
from script_loader import load_script
from diffusers_var_accel.embedded import EMBEDDED_MODEL_PATH
from diffusers_var_accel.hub import has_hub_shim, write_hub_shim
from diffusers_var_accel.lab.cards import make_model_card, read_benchmark_results, write_model_card
from diffusers_var_accel.schedulers.presets import PRESETS_DIR

REPO = Path(__file__).resolve().parents[2]
METHODS = sorted(registry_lists.METHODS)  # every library method, from the registry (the cards list them sorted)

HART_INDEX = {
    "_class_name": "HARTPipeline",
    "_diffusers_version": "0.42.1",
    "acceleration": [None, None],
    "text_encoder": ["transformers", "Qwen2Model"],
    "tokenizer": ["transformers", "TokenizersBackend"],
    "transformer": ["diffusers_var_accel.models.transformer_hart", "HARTTransformer"],
    "vae": ["diffusers_var_accel.models.autoencoder_hart", "HARTHybridTokenizer"],
}

#: What `var-accel bench` writes (abridged): methods keyed by spec, nested flops / fidelity / scorer, a run object.
BENCH = {
    "methods": {
        "baseline": {
            "spec": "baseline",
            "speedup": 1.0,
            "flops": {"total_gflops": 55700.0, "ratio": 1.0},
            "fidelity": {"psnr_mean": "inf", "ssim_mean": 1.0},
            "scorer": {"accuracy": 0.5, "n": 8},
        },
        "fastvar": {
            "spec": "fastvar",
            "speedup": 1.62,
            "flops": {"total_gflops": 31800.0, "ratio": 1.75},
            "fidelity": {"psnr_mean": 24.25, "ssim_mean": 0.8125},
            "scorer": {"accuracy": None, "n": 0},
        },
    },
    "run": {
        "model": "hart-0.7b-diffusers",
        "device_name": "NVIDIA H200",
        "dtype": "bfloat16",
        "height": 1024,
        "width": 1024,
        "seeds": [0, 1],
    },
    "notes": ["ignored"],
}


@pytest.fixture
def infinity_folder(tmp_path):
    folder = tmp_path / "infinity-2b-diffusers"
    folder.mkdir()
    shutil.copy(EMBEDDED_MODEL_PATH / "model_index.json", folder / "model_index.json")
    return folder


@pytest.fixture
def hart_folder(tmp_path):
    folder = tmp_path / "hart-0.7b-diffusers"
    folder.mkdir()
    (folder / "model_index.json").write_text(json.dumps(HART_INDEX, indent=2))
    return folder


def code_blocks(text: str):
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


# ---------------------------------------------------------------------------------------------------------------------
# benchmark results
# ---------------------------------------------------------------------------------------------------------------------
def test_results_of_var_accel_bench(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(BENCH))
    out = read_benchmark_results(path)
    base, fast = out["records"]
    assert base == {
        "method": "baseline",
        "speedup": 1.0,
        "tflops": 55.7,
        "psnr": math.inf,
        "ssim": 1.0,
        "accuracy": 0.5,
    }
    assert fast == {
        "method": "fastvar",
        "speedup": 1.62,
        "tflops": 31.8,
        "psnr": 24.25,
        "ssim": 0.8125,
        "accuracy": None,
    }
    assert out["run"] == {
        "model": "hart-0.7b-diffusers",
        "device_name": "NVIDIA H200",
        "dtype": "bfloat16",
        "height": 1024,
        "width": 1024,
    }


def test_results_as_a_plain_list_of_records():
    records = [
        {
            "method": "lazyvar",
            "speedup": "2.5",
            "tflops": 26.39,
            "psnr": 20,
            "ssim": 0.7,
            "accuracy": 62.5,
            "extra": [1],
        },
        {"method": "fastvar", "flops": 3.710e13},
        {"method": "depthvar", "gflops": 41850},
        {"method": "arvar"},
    ]
    for data in (records, {"results": records}, {"records": records}):
        lazy, fast, depth, arvar = read_benchmark_results(data)["records"]
        assert lazy == {
            "method": "lazyvar",
            "speedup": 2.5,
            "tflops": 26.39,
            "psnr": 20.0,
            "ssim": 0.7,
            "accuracy": 0.625,
        }
        assert fast["tflops"] == pytest.approx(37.10) and depth["tflops"] == pytest.approx(41.85)
        assert all(arvar[k] is None for k in ("speedup", "tflops", "psnr", "ssim", "accuracy"))


@pytest.mark.parametrize(
    "data, message",
    [
        ({"notes": "nothing"}, "no per-method records"),
        ([], "no per-method records"),
        ([{"speedup": 2.0}], "record 0 names no method"),
        ([{"method": "lazyvar", "psnr": "high"}], "'lazyvar': psnr must be a number"),
        ([{"method": "lazyvar", "speedup": True}], "speedup must be a number"),
        (["lazyvar"], "record 0 is not an object"),
    ],
)
def test_malformed_results_are_rejected(data, message):
    with pytest.raises(ValueError, match=message):
        read_benchmark_results(data)


# ---------------------------------------------------------------------------------------------------------------------
# the card
# ---------------------------------------------------------------------------------------------------------------------
def test_infinity_card_metadata_presets_and_snippet(infinity_folder):
    write_hub_shim(infinity_folder)
    card = make_model_card(
        infinity_folder,
        repo_id="my-org/infinity-2b",
        license="mit",
        base_model="FoundationVision/Infinity",
        tags=["bitwise"],
    )
    meta = card.data.to_dict()
    assert (meta["library_name"], meta["pipeline_tag"], meta["license"], meta["base_model"]) == (
        "diffusers",
        "text-to-image",
        "mit",
        "FoundationVision/Infinity",
    )
    assert set(METHODS + ["infinity", "text-to-image", "diffusers-var-accel", "bitwise"]) <= set(meta["tags"])
    assert "hart" not in meta["tags"] and "acceleration_results" not in meta
    presets = meta["acceleration_presets"]
    assert sorted(presets) == METHODS
    for method in METHODS:
        stored = json.loads((PRESETS_DIR / "infinity-2b" / method / "acceleration_config.json").read_text())
        assert (
            presets[method]["preset"] == f"infinity-2b/{method}"
            and presets[method]["scheduler"] == stored["_class_name"]
        )
        assert presets[method]["settings"] == {k: v for k, v in stored.items() if not k.startswith("_")}
    text = card.text
    assert 'InfinityPipeline.from_pretrained("my-org/infinity-2b")' in text  # our class checks the shim itself
    assert 'DiffusionPipeline.from_pretrained("my-org/infinity-2b", trust_remote_code=True)' in text
    assert "pipe.enable_lazyvar()" in text and 'LazyVARScheduler.from_pretrained("infinity-2b/lazyvar")' in text
    assert (
        "| fastvar | `infinity-2b/fastvar` | `FastVARScheduler` |" in text
        and "keep_ratios=[0.2, 0.1, 0.05, 0.01]" in text
    )
    assert "| `transformer` | `diffusers_var_accel.models.transformer_infinity` | `InfinityTransformer` |" in text
    assert "## Measured" not in text
    blocks = code_blocks(text)
    assert len(blocks) == 3
    for block in blocks:
        compile(block, "<model card>", "exec")


def test_hart_card_with_results_and_without_shim(hart_folder):
    card = make_model_card(hart_folder, results=BENCH)
    meta = card.data.to_dict()
    assert "license" not in meta and "hart" in meta["tags"]
    assert [p["preset"] for p in meta["acceleration_presets"].values()] == [f"hart-0.7b/{m}" for m in METHODS]
    assert meta["acceleration_results"] == [
        {"method": "baseline", "speedup": 1.0, "tflops": 55.7, "psnr": "inf", "ssim": 1.0, "accuracy": 0.5},
        {"method": "fastvar", "speedup": 1.62, "tflops": 31.8, "psnr": 24.25, "ssim": 0.8125},
    ]
    text = card.text
    assert "trust_remote_code" not in text and "DiffusionPipeline" not in text  # no shim in the folder
    assert 'HARTPipeline.from_pretrained("hart-0.7b-diffusers")' in text  # the folder's name by default
    assert "| method | speed-up | TFLOPs | PSNR (dB) | SSIM | accuracy |" in text
    assert "| baseline | 1.00× | 55.70 | ∞ (identical) | 1.0000 | 50.0 % |" in text
    assert "| fastvar | 1.62× | 31.80 | 24.25 | 0.8125 | – |" in text
    assert "device name NVIDIA H200" in text


def test_write_model_card_round_trip_shim_and_presets(hart_folder):
    path = write_model_card(hart_folder, results=BENCH, copy_presets=True, repo_id="my-org/hart", license="mit")
    assert path == hart_folder / "README.md" and has_hub_shim(hart_folder)
    loaded = ModelCard.load(path)
    assert (
        loaded.data.to_dict()
        == make_model_card(hart_folder, results=BENCH, repo_id="my-org/hart", license="mit").data.to_dict()
    )
    for method in METHODS:
        assert (hart_folder / method / "acceleration_config.json").is_file()
    assert 'LazyVARScheduler.from_pretrained("my-org/hart", subfolder="lazyvar")' in loaded.text
    write_model_card(hart_folder, shim=False)
    assert (
        not (hart_folder / "pipeline.py").exists()
        and json.loads((hart_folder / "model_index.json").read_text())["_class_name"] == "HARTPipeline"
    )
    assert "trust_remote_code" not in (hart_folder / "README.md").read_text()


def test_a_folder_that_is_not_ours_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no model_index.json"):
        make_model_card(tmp_path)
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "FluxPipeline"}))
    with pytest.raises(ValueError, match="FluxPipeline"):
        make_model_card(tmp_path)


# ---------------------------------------------------------------------------------------------------------------------
# the script
# ---------------------------------------------------------------------------------------------------------------------
def load_model_card_script():
    return load_script("make_model_card")


def test_the_script(infinity_folder, tmp_path, capsys):
    script = load_model_card_script()
    results = tmp_path / "results.json"
    results.write_text(json.dumps(BENCH))
    assert (
        script.main(
            [
                str(infinity_folder),
                "--results",
                str(results),
                *"--repo-id my-org/inf --license apache-2.0 --tag shapes".split(),
            ]
        )
        == 0
    )
    card = ModelCard.load(infinity_folder / "README.md")
    assert (
        card.data.license == "apache-2.0" and "shapes" in card.data.tags and len(card.data.acceleration_results) == 2
    )
    assert has_hub_shim(infinity_folder)
    assert script.main([str(tmp_path / "missing")]) == 2
    assert "no model_index.json" in capsys.readouterr().err


def test_a_card_of_the_embedded_model_fits_it(tmp_path):
    """A saved copy of the embedded shapes model: a shapes prompt in the usage snippets, its small FLOPs in GFLOPs (not
    0.00 TFLOPs), and a note that its measured numbers are of its own calibrated presets, not the family's above."""
    folder = tmp_path / "shapes-infinity-tiny"
    folder.mkdir()
    shutil.copy(EMBEDDED_MODEL_PATH / "model_index.json", folder / "model_index.json")
    (folder / "transformer").mkdir()
    shutil.copy(EMBEDDED_MODEL_PATH / "transformer" / "config.json", folder / "transformer" / "config.json")
    small = json.loads(json.dumps(BENCH))
    small["methods"]["baseline"]["flops"]["total_gflops"] = 7.17
    small["methods"]["fastvar"]["flops"]["total_gflops"] = 3.54
    small["run"]["model"] = "embedded"
    text = make_model_card(folder, results=small).text
    assert 'pipe("two red circles"' in text and "red fox" not in text
    assert "| method | speed-up | GFLOPs | PSNR (dB) | SSIM | accuracy |" in text
    assert "| baseline | 1.00× | 7.17 |" in text and "| fastvar | 1.62× | 3.54 |" in text
    assert "its own calibrated presets (`embedded/<method>`), not the `infinity-2b/<method>` presets above" in text
    # a folder whose transformer is another model keeps the general prompt and says nothing of the embedded presets
    other = make_model_card(folder, results=BENCH, example_prompt="a lighthouse at dusk").text
    assert 'pipe("a lighthouse at dusk"' in other and "calibrated presets" not in other


def test_a_method_with_tuple_settings_gives_a_card_and_to_dict_with_lists_only(infinity_folder):
    """A plug-in method whose presets and defaults are tuples (as the docs' example's are) gets a card whose YAML holds
    plain lists: ``to_dict`` normalises every configuration once (no ``!!python/tuple`` on the Hub)."""
    from diffusers.configuration_utils import register_to_config

    from diffusers_var_accel.schedulers.registry import unregister_method
    from diffusers_var_accel.schedulers.scheduling_var_base import VARAccelScheduler

    class TupleSettingsScheduler(VARAccelScheduler, method="tuplesettings"):
        presets = {
            "infinity": {"halved_scales": (-2, -1), "table": ((0.5, 0.25), (0.125,)), "model_family": "infinity"}
        }

        @register_to_config
        def __init__(self, halved_scales=(-1,), table=((1.0,),), model_family=None):
            super().__init__()

    def has_tuple(value):
        if isinstance(value, tuple):
            return True
        if isinstance(value, list):
            return any(has_tuple(v) for v in value)
        return isinstance(value, dict) and any(has_tuple(v) for v in value.values())

    try:
        scheduler = TupleSettingsScheduler.from_preset("infinity")
        assert isinstance(scheduler.config["table"], tuple)  # the configuration keeps what it was given
        assert scheduler.to_dict() == {
            "_class_name": "TupleSettingsScheduler",
            "halved_scales": [-2, -1],
            "table": [[0.5, 0.25], [0.125]],
            "model_family": "infinity",
        }
        assert not has_tuple(scheduler.to_dict()) and not has_tuple(TupleSettingsScheduler().to_dict())
        card = make_model_card(infinity_folder, repo_id="my-org/infinity-2b")
        text = str(card)
        assert "python/tuple" not in text and "tuplesettings" in card.data.to_dict()["tags"]
        settings = card.data.to_dict()["acceleration_presets"]["tuplesettings"]["settings"]
        assert settings == {"halved_scales": [-2, -1], "table": [[0.5, 0.25], [0.125]], "model_family": "infinity"}
        assert not has_tuple(card.data.to_dict())
    finally:
        unregister_method("tuplesettings")
