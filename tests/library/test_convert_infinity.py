"""The official-checkpoint converter (``scripts/convert_infinity_original.py`` and ``convert_infinity_original``).

Converts the official-format tiny fixture checkpoints (plus a tiny T5 built locally), reloads the written folder with
``InfinityPipeline.from_pretrained`` and replays the fixture's ``greedy_cfg`` reference run from its stored T5
features. ``VAR_ACCEL_INFINITY_FIXTURE`` points at another fixture folder of the same layout, as in
``test_parity_infinity.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from diffusers_var_accel import InfinityPipeline
from diffusers_var_accel.pipelines.infinity.convert import convert_infinity_original
from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_t5

from fixture_utils import load_fixture, official_call_kwargs, padded_text

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "convert_infinity_original.py"
FIXTURE_DIR = Path(
    os.environ.get("VAR_ACCEL_INFINITY_FIXTURE", Path(__file__).resolve().parents[1] / "fixtures" / "infinity")
)
RUN = "greedy_cfg"


@pytest.fixture(scope="module")
def fixture():
    return load_fixture(FIXTURE_DIR, "Infinity", "VAR_ACCEL_INFINITY_FIXTURE")


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory, fixture):
    """A tiny T5 encoder + tokenizer whose width matches the fixture's text features, saved like a HF folder."""
    _, inputs, _ = fixture
    folder = tmp_path_factory.mktemp("tiny_t5")
    text_encoder, tokenizer = build_tiny_t5(text_channels=inputs["text.kv_compact"].shape[1], seed=0)
    text_encoder.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def converted_dir(tmp_path_factory, t5_dir):
    out = tmp_path_factory.mktemp("converted")
    pipe = convert_infinity_original(
        FIXTURE_DIR / "infinity_tiny.pth", FIXTURE_DIR / "vae_tiny.pth", text_encoder_path=t5_dir
    )
    pipe.save_pretrained(out)
    return out


def _replay_latents(pipe, fixture, run=RUN):
    manifest, inputs, _ = fixture
    call = manifest["runs"][run]["call"]
    embeds, mask = padded_text(inputs)
    pipe.set_progress_bar_config(disable=True)
    return pipe(
        **official_call_kwargs(manifest, call, embeds, mask),
        output_type="latent",
    ).images


def test_converted_folder_reproduces_the_reference_run(fixture, converted_dir):
    _, _, ref = fixture
    for name in ("model_index.json", "transformer", "vae", "text_encoder", "tokenizer"):
        assert (converted_dir / name).exists(), name
    assert list((converted_dir / "transformer").glob("*.safetensors")), "weights must be saved as safetensors"
    assert list((converted_dir / "vae").glob("*.safetensors"))
    pipe = InfinityPipeline.from_pretrained(converted_dir)
    latents = _replay_latents(pipe, fixture)
    torch.testing.assert_close(latents.float(), ref[f"{RUN}.summed_codes"], atol=1e-6, rtol=0)
    # the converted text encoder is the one we saved and is wired to the tokenizer
    embeds, mask = pipe.encode_prompt(["a red fox", "a cat"])
    assert embeds.shape[0] == 2 and embeds.shape[-1] == pipe.transformer.config.text_channels
    assert mask.sum(1).tolist() == [4, 3]  # 3 and 2 words, plus </s>


def test_converted_weights_equal_the_official_ones(fixture, converted_dir):
    """Every official tensor lands, unchanged, in the saved transformer (key renaming aside)."""
    official = torch.load(FIXTURE_DIR / "infinity_tiny.pth", map_location="cpu", weights_only=True)
    pipe = InfinityPipeline.from_pretrained(converted_dir, text_encoder=None, tokenizer=None)
    ours = pipe.transformer.state_dict()
    from diffusers_var_accel.models.transformer_infinity import convert_infinity_checkpoint

    converted = convert_infinity_checkpoint(official)
    assert set(converted) == set(ours)
    for key, value in converted.items():
        assert torch.equal(ours[key], value), key


def test_convert_without_text_encoder_runs_from_embeds(fixture):
    pipe = convert_infinity_original(FIXTURE_DIR / "infinity_tiny.pth", FIXTURE_DIR / "vae_tiny.pth")
    assert pipe.text_encoder is None and pipe.tokenizer is None
    _, _, ref = fixture
    torch.testing.assert_close(_replay_latents(pipe, fixture).float(), ref[f"{RUN}.summed_codes"], atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="prompt_embeds"):
        pipe("a prompt", height=fixture[0]["image_hw"][0], width=fixture[0]["image_hw"][1])


def test_convert_dtype_and_config_checks(t5_dir):
    pipe = convert_infinity_original(
        FIXTURE_DIR / "infinity_tiny.pth",
        FIXTURE_DIR / "vae_tiny.pth",
        text_encoder_path=t5_dir,
        torch_dtype=torch.bfloat16,
    )
    assert pipe.transformer.dtype == torch.bfloat16 and pipe.vae.dtype == torch.bfloat16
    assert pipe.text_encoder.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="infinity-3b"):
        convert_infinity_original(
            FIXTURE_DIR / "infinity_tiny.pth", FIXTURE_DIR / "vae_tiny.pth", config="infinity-3b"
        )
    # a named config that does not fit the checkpoint's shapes is a strict-load error, not a silent partial load
    with pytest.raises(ValueError, match="pos_start"):
        convert_infinity_original(
            FIXTURE_DIR / "infinity_tiny.pth", FIXTURE_DIR / "vae_tiny.pth", config="infinity-2b"
        )
    with pytest.raises(FileNotFoundError, match="no_such_file"):
        convert_infinity_original(FIXTURE_DIR / "no_such_file.pth", FIXTURE_DIR / "vae_tiny.pth")


def test_convert_rejects_a_text_encoder_of_the_wrong_width(tmp_path, fixture):
    _, inputs, _ = fixture
    width = inputs["text.kv_compact"].shape[1] + 2
    text_encoder, tokenizer = build_tiny_t5(text_channels=width)
    text_encoder.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=f"{width}-channel"):
        convert_infinity_original(
            FIXTURE_DIR / "infinity_tiny.pth", FIXTURE_DIR / "vae_tiny.pth", text_encoder_path=tmp_path
        )


def _run_script(*args):
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, env=env, cwd=REPO, timeout=300
    )


def test_script_writes_a_loadable_folder(tmp_path, fixture, t5_dir):
    out = tmp_path / "out"
    result = _run_script(
        "--transformer",
        FIXTURE_DIR / "infinity_tiny.pth",
        "--vae",
        FIXTURE_DIR / "vae_tiny.pth",
        "--text-encoder",
        t5_dir,
        "--dtype",
        "float32",
        "--output",
        out,
    )
    assert result.returncode == 0, result.stderr
    index = json.loads((out / "model_index.json").read_text())
    assert index["_class_name"] == "InfinityPipeline"
    assert index["transformer"] == ["diffusers_var_accel.models.transformer_infinity", "InfinityTransformer"]
    assert index["text_encoder"][1] == "T5EncoderModel" and index["tokenizer"][0] == "transformers"
    _, _, ref = fixture
    latents = _replay_latents(InfinityPipeline.from_pretrained(out), fixture)
    torch.testing.assert_close(latents.float(), ref[f"{RUN}.summed_codes"], atol=1e-6, rtol=0)


def test_script_fails_on_a_wrong_key(tmp_path):
    state_dict = torch.load(FIXTURE_DIR / "infinity_tiny.pth", map_location="cpu", weights_only=True)
    state_dict["bogus_extra_key.weight"] = torch.zeros(3)
    bad = tmp_path / "bad.pth"
    torch.save(state_dict, bad)
    out = tmp_path / "out"
    result = _run_script("--transformer", bad, "--vae", FIXTURE_DIR / "vae_tiny.pth", "--output", out)
    assert result.returncode != 0
    assert "bogus_extra_key.weight" in result.stderr
    assert not (out / "model_index.json").exists()


def test_script_fails_on_a_wrong_vae_key(tmp_path):
    checkpoint = torch.load(FIXTURE_DIR / "vae_tiny.pth", map_location="cpu", weights_only=True)
    state_dict = checkpoint["vae"] if "vae" in checkpoint else checkpoint
    removed = sorted(k for k in state_dict if k.startswith("decoder.conv_out"))[0]
    del state_dict[removed]
    bad = tmp_path / "bad_vae.pth"
    torch.save(checkpoint, bad)
    result = _run_script(
        "--transformer", FIXTURE_DIR / "infinity_tiny.pth", "--vae", bad, "--output", tmp_path / "out"
    )
    assert result.returncode != 0
    assert "decoder.conv_out" in result.stderr and "missing" in result.stderr.lower()
