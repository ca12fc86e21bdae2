"""The official-folder converter (``scripts/convert_hart_original.py`` and ``load_original_hart_pipeline``).

Converts the official-format tiny fixture folder (``hart-tiny/llm`` + ``hart-tiny/tokenizer``, plus a tiny Qwen2 built
locally), reloads the written folder with ``HARTPipeline.from_pretrained`` and replays the fixture's greedy guided run
from its stored context features, as ``test_parity_hart.py`` does. ``VAR_ACCEL_HART_FIXTURE`` points at another
fixture folder of the same layout; every size is read from the folder, and a missing folder fails.

The script runs in subprocesses for the conversions themselves and for one strict-loading failure (started together
to save time); the other error cases call its ``main(argv)`` in-process, which is what ``sys.exit(main())`` runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from script_loader import load_script
import torch
from safetensors.torch import load_file, save_file

from diffusers_var_accel import HARTPipeline
from diffusers_var_accel.models.autoencoder_hart import hart_tokenizer_state_dict_from_original
from diffusers_var_accel.models.transformer_hart import (
    IGNORED_ORIGINAL_KEYS,
    convert_hart_checkpoint,
    hart_config_from_original,
)
from diffusers_var_accel.pipelines.hart.convert import load_original_hart_pipeline
from diffusers_var_accel.pipelines.hart.tiny import build_tiny_qwen2

from fixture_utils import replay_hart_run

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "convert_hart_original.py"
FIXTURE_DIR = Path(os.environ.get("VAR_ACCEL_HART_FIXTURE", Path(__file__).resolve().parents[1] / "fixtures" / "hart"))
CHECKPOINT = FIXTURE_DIR / "hart-tiny"


def _require_fixture():
    if not (FIXTURE_DIR / "manifest.json").is_file() or not (CHECKPOINT / "llm" / "config.json").is_file():
        pytest.fail(f"HART fixture folder missing or incomplete: {FIXTURE_DIR} (set VAR_ACCEL_HART_FIXTURE)")


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    yield


@pytest.fixture(scope="module")
def fixture():
    """(manifest, inputs, run name, run meta, reference) of the fixture's greedy guided run without Gumbel mixing."""
    _require_fixture()
    manifest = json.loads((FIXTURE_DIR / "manifest.json").read_text())
    runs = [
        name
        for name, meta in sorted(manifest["runs"].items())
        if meta["greedy_top_k1"] and meta["call"]["cfg"] != 0 and not meta["call"]["more_smooth"]
    ]
    if not runs:
        pytest.fail(f"{FIXTURE_DIR} has no greedy guided run without more_smooth to replay")
    run = runs[0]
    return (
        manifest,
        load_file(FIXTURE_DIR / "inputs.safetensors"),
        run,
        manifest["runs"][run],
        load_file(FIXTURE_DIR / f"ref_{run}.safetensors"),
    )


@pytest.fixture(scope="module")
def official_config():
    _require_fixture()
    return json.loads((CHECKPOINT / "llm" / "config.json").read_text())


@pytest.fixture(scope="module")
def ema_state_dict():
    _require_fixture()
    return torch.load(CHECKPOINT / "llm" / "ema_model.bin", map_location="cpu", weights_only=True)


def replay(pipe: HARTPipeline, inputs, meta):
    """The official call of a run from its stored context features: (image, {scale: tokens})."""
    pipe.set_progress_bar_config(disable=True)
    image, recorded = replay_hart_run(pipe, inputs, meta)
    return image, {si: values["tokens"] for si, values in recorded.items()}


def assert_reproduces_the_reference(pipe, fixture):
    manifest, inputs, run, meta, ref = fixture
    image, tokens = replay(pipe, inputs, meta)
    num_scales = len(meta["t_guidance_per_scale"])
    assert sorted(tokens) == list(range(num_scales))
    for si in range(num_scales):
        assert torch.equal(tokens[si], ref[f"idx_s{si}"]), (run, si)
    torch.testing.assert_close(image, ref["image"], atol=1e-4, rtol=0)


def copy_checkpoint(dst: Path) -> Path:
    """A writable copy of the official fixture folder (the stored files and folders may be read-only)."""
    _require_fixture()
    for root, _, files in os.walk(CHECKPOINT):
        target = dst / os.path.relpath(root, CHECKPOINT)
        target.mkdir(parents=True, exist_ok=True)
        for name in files:
            shutil.copyfile(os.path.join(root, name), target / name)
    return dst


def write_ema(folder: Path, state_dict):
    path = folder / "llm" / "ema_model.bin"
    path.unlink()
    torch.save(dict(state_dict), path)


def _env():
    return dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )


def _missing_block_key(ema_state_dict):
    return sorted(k for k in ema_state_dict if k.startswith("blocks."))[-1]


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory, official_config):
    """A tiny Qwen2 + tokenizer whose width is the fixture's context_dim, saved like a HF folder."""
    folder = tmp_path_factory.mktemp("tiny_qwen2")
    text_encoder, tokenizer = build_tiny_qwen2(hidden_size=official_config["context_dim"], seed=0)
    text_encoder.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, official_config):
    """The tiny word-level tokenizer alone (``--tokenizer``). Beside a Qwen2 ``config.json``, transformers 5 loads any
    tokenizer as ``Qwen2Tokenizer``, which drops the tiny vocabulary's words (the script honours tokenizer_config.json's class: see below)."""
    folder = tmp_path_factory.mktemp("tiny_tokenizer")
    _, tokenizer = build_tiny_qwen2(hidden_size=official_config["context_dim"], seed=0)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory, qwen_dir, tokenizer_dir, ema_state_dict):
    """The script run in subprocesses (started together): the plain conversion, the conversion with a text encoder
    and a checkpoint with a missing key. ``{name: (CompletedProcess, output folder, extra)}``."""
    base = tmp_path_factory.mktemp("cli")
    broken = copy_checkpoint(base / "missing_key_checkpoint")
    removed = _missing_block_key(ema_state_dict)
    write_ema(broken, {k: v for k, v in ema_state_dict.items() if k != removed})
    jobs = {
        "plain": (["--checkpoint", CHECKPOINT, "--output", base / "plain"], base / "plain", None),
        "text": (
            [
                "--checkpoint",
                CHECKPOINT,
                "--text-encoder",
                qwen_dir,
                "--tokenizer",
                tokenizer_dir,
                "--output",
                base / "text",
            ],
            base / "text",
            None,
        ),
        "missing": (["--checkpoint", broken, "--output", base / "missing"], base / "missing", removed),
    }
    procs = {
        name: subprocess.Popen(
            [sys.executable, str(SCRIPT), *map(str, args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
            cwd=REPO,
        )
        for name, (args, _, _) in jobs.items()
    }
    results = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        results[name] = (
            subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr),
            jobs[name][1],
            jobs[name][2],
        )
    return results


@pytest.fixture(scope="module")
def cli():
    """The script as a module, to call ``main(argv)`` in-process."""
    _require_fixture()
    return load_script(SCRIPT, "convert_hart_original_script")


def run_main(cli, capsys, *args):
    capsys.readouterr()
    code = cli.main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ---------------------------------------------------------------------------------------------------------------------
# conversions
# ---------------------------------------------------------------------------------------------------------------------
def test_script_converts_the_official_folder(cli_runs, fixture, official_config):
    result, out, _ = cli_runs["plain"]
    assert result.returncode == 0, result.stderr
    assert "wrote" in result.stdout and "transformer" in result.stdout
    index = json.loads((out / "model_index.json").read_text())
    assert index["_class_name"] == "HARTPipeline"
    assert index["transformer"] == ["diffusers_var_accel.models.transformer_hart", "HARTTransformer"]
    assert index["vae"] == ["diffusers_var_accel.models.autoencoder_hart", "HARTHybridTokenizer"]
    assert index["text_encoder"] == [None, None] and index["tokenizer"] == [None, None]
    assert list((out / "transformer").glob("*.safetensors")) and list((out / "vae").glob("*.safetensors"))
    pipe = HARTPipeline.from_pretrained(out)
    assert pipe.text_encoder is None and pipe.tokenizer is None
    cfg = pipe.transformer.config
    assert (cfg.depth, cfg.embed_dim, cfg.context_tokens, cfg.context_dim) == (
        official_config["depth"],
        official_config["embed_dim"],
        official_config["context_token"],
        official_config["context_dim"],
    )
    assert list(cfg.patch_nums) == list(official_config["patch_nums"])
    assert_reproduces_the_reference(pipe, fixture)
    with pytest.raises(ValueError, match="prompt_embeds"):
        pipe("a red fox")


def test_script_with_a_text_encoder(cli_runs, fixture, qwen_dir, official_config):
    result, out, _ = cli_runs["text"]
    assert result.returncode == 0, result.stderr
    assert "text_encoder" in result.stdout and "tokenizer" in result.stdout
    index = json.loads((out / "model_index.json").read_text())
    assert index["text_encoder"] == ["transformers", "Qwen2Model"] and index["tokenizer"][0] == "transformers"
    pipe = HARTPipeline.from_pretrained(out)
    assert_reproduces_the_reference(pipe, fixture)
    # the saved text encoder is the one given, wired to its tokenizer
    reference_encoder, _ = build_tiny_qwen2(hidden_size=official_config["context_dim"], seed=0)
    ours, theirs = pipe.text_encoder.state_dict(), reference_encoder.state_dict()
    assert set(ours) == set(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)
    _assert_tiny_tokenizer(pipe.tokenizer)
    T, D = official_config["context_token"], official_config["context_dim"]
    prompts = ["a red fox", "two cats sleeping on a bed"]
    embeds, position_ids = pipe.encode_prompt(prompts)
    mask = torch.tensor(pipe.tokenizer(prompts, padding="max_length", max_length=T, truncation=True).attention_mask)
    assert embeds.shape == (2, T, D) and torch.equal(position_ids, mask.cumsum(1) - 1)
    image = pipe("a red fox", generator=torch.Generator().manual_seed(0), output_type="pt").images
    assert image.shape == (1, 3, pipe.default_size, pipe.default_size)


def _assert_tiny_tokenizer(tokenizer):
    """``tokenizer`` splits text as the tiny word-level tokenizer of ``build_tiny_qwen2``."""
    _, reference = build_tiny_qwen2(hidden_size=4, seed=0)
    for text in ("a red fox", "two cats sleeping on a bed"):
        assert tokenizer(text).input_ids == reference(text).input_ids, (
            text,
            tokenizer(text).input_ids,
            type(tokenizer),
        )
    assert tokenizer.pad_token_id == reference.pad_token_id


def test_text_encoder_folder_with_its_own_tokenizer(cli, capsys, tmp_path, qwen_dir):
    code, _, err = run_main(
        cli, capsys, "--checkpoint", CHECKPOINT, "--text-encoder", qwen_dir, "--output", tmp_path / "out"
    )
    assert code == 0, err
    _assert_tiny_tokenizer(HARTPipeline.from_pretrained(tmp_path / "out").tokenizer)


def test_converted_weights_equal_the_official_ones(cli_runs, ema_state_dict):
    """Every official tensor lands, unchanged, in the saved folder (key renaming aside)."""
    _, out, _ = cli_runs["plain"]
    pipe = HARTPipeline.from_pretrained(out)
    ours = pipe.transformer.state_dict()
    expected = convert_hart_checkpoint(ema_state_dict)
    assert not set(IGNORED_ORIGINAL_KEYS) & set(expected)
    assert set(expected) == set(ours)
    for key, value in expected.items():
        assert torch.equal(ours[key], value), key
    tokenizer_weights = hart_tokenizer_state_dict_from_original(
        load_file(CHECKPOINT / "tokenizer" / "model.safetensors")
    )
    vae = pipe.vae.state_dict()
    assert set(tokenizer_weights) == set(vae)
    for key, value in tokenizer_weights.items():
        assert torch.equal(vae[key], value), key


def test_no_ema_loads_the_main_weights(cli, capsys, tmp_path, fixture, ema_state_dict):
    code, out, err = run_main(cli, capsys, "--checkpoint", CHECKPOINT, "--no-ema", "--output", tmp_path / "main")
    assert code == 0, err
    pipe = HARTPipeline.from_pretrained(tmp_path / "main")
    main_weights = convert_hart_checkpoint(load_file(CHECKPOINT / "llm" / "model.safetensors"))
    ours = pipe.transformer.state_dict()
    assert set(main_weights) == set(ours) and all(torch.equal(ours[k], main_weights[k]) for k in ours)
    ema = convert_hart_checkpoint(ema_state_dict)
    assert any(not torch.equal(ours[k], ema[k]) for k in ours)
    _, inputs, _, meta, ref = fixture
    image, _ = replay(pipe, inputs, meta)
    assert image.shape == ref["image"].shape and (image - ref["image"]).abs().max() > 1e-3


def test_llm_folder_instead_of_the_root(cli, capsys, tmp_path, cli_runs):
    code, _, err = run_main(cli, capsys, "--checkpoint", CHECKPOINT / "llm", "--output", tmp_path / "from_llm")
    assert code == 0, err
    from_llm = HARTPipeline.from_pretrained(tmp_path / "from_llm")
    from_root = HARTPipeline.from_pretrained(cli_runs["plain"][1])
    for name in ("transformer", "vae"):
        a, b = getattr(from_llm, name).state_dict(), getattr(from_root, name).state_dict()
        assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a), name


def test_dtype_option(cli, capsys, tmp_path):
    code, _, err = run_main(
        cli, capsys, "--checkpoint", CHECKPOINT, "--dtype", "bfloat16", "--output", tmp_path / "bf16"
    )
    assert code == 0, err
    for component in ("transformer", "vae"):
        (weights_file,) = (tmp_path / "bf16" / component).glob("*.safetensors")
        dtypes = {v.dtype for v in load_file(weights_file).values() if v.is_floating_point()}
        assert dtypes == {torch.bfloat16}, (component, dtypes)
    pipe = HARTPipeline.from_pretrained(tmp_path / "bf16", dtype=torch.bfloat16)
    assert pipe.transformer.dtype == torch.bfloat16 and pipe.vae.dtype == torch.bfloat16


def test_discriminator_keys_are_ignored(cli, capsys, tmp_path, cli_runs):
    folder = copy_checkpoint(tmp_path / "with_disc")
    path = folder / "tokenizer" / "model.safetensors"
    weights = load_file(path)
    weights.update({"disc.conv_in.weight": torch.randn(4, 3, 3, 3), "disc.head.bias": torch.randn(1)})
    path.unlink()
    save_file(weights, path)
    code, _, err = run_main(cli, capsys, "--checkpoint", folder, "--output", tmp_path / "out")
    assert code == 0, err
    a = HARTPipeline.from_pretrained(tmp_path / "out").vae.state_dict()
    b = HARTPipeline.from_pretrained(cli_runs["plain"][1]).vae.state_dict()
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert not any("disc" in k for k in a)


# ---------------------------------------------------------------------------------------------------------------------
# strict loading: every failure exits with status 1, names the offending key and writes nothing
# ---------------------------------------------------------------------------------------------------------------------
def test_script_fails_on_a_missing_key(cli_runs):
    result, out, removed = cli_runs["missing"]
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert removed in result.stderr and "missing" in result.stderr.lower()
    assert "Traceback" not in result.stderr
    assert not (out / "model_index.json").exists()


def test_unexpected_key(cli, capsys, tmp_path, ema_state_dict):
    folder = copy_checkpoint(tmp_path / "ckpt")
    write_ema(folder, {**ema_state_dict, "bogus_extra_module.weight": torch.zeros(3)})
    code, _, err = run_main(cli, capsys, "--checkpoint", folder, "--output", tmp_path / "out")
    assert code == 1 and "bogus_extra_module.weight" in err and "unexpected" in err.lower()
    assert not (tmp_path / "out" / "model_index.json").exists()


def test_wrong_shape(cli, capsys, tmp_path, ema_state_dict):
    key = next(k for k in sorted(ema_state_dict) if k.startswith("blocks.") and ema_state_dict[k].ndim >= 1)
    good = tuple(ema_state_dict[key].shape)
    bad = (good[0] + 1, *good[1:])
    folder = copy_checkpoint(tmp_path / "ckpt")
    write_ema(folder, {**ema_state_dict, key: torch.zeros(bad)})
    code, _, err = run_main(cli, capsys, "--checkpoint", folder, "--output", tmp_path / "out")
    assert code == 1 and key in err and str(bad) in err and str(good) in err
    assert not (tmp_path / "out" / "model_index.json").exists()


def test_every_bad_key_is_listed(cli, capsys, tmp_path, ema_state_dict):
    removed = _missing_block_key(ema_state_dict)
    state_dict = {**ema_state_dict, "extra_a": torch.zeros(1), "extra_b": torch.zeros(1)}
    del state_dict[removed]
    folder = copy_checkpoint(tmp_path / "ckpt")
    write_ema(folder, state_dict)
    code, _, err = run_main(cli, capsys, "--checkpoint", folder, "--output", tmp_path / "out")
    assert code == 1
    for key in (removed, "extra_a", "extra_b"):
        assert key in err, key


def test_a_bad_diffusion_head_key_is_named_as_in_the_checkpoint(cli, capsys, tmp_path, ema_state_dict):
    removed = sorted(k for k in ema_state_dict if k.startswith("diffloss."))[-1]
    folder = copy_checkpoint(tmp_path / "ckpt")
    write_ema(folder, {k: v for k, v in ema_state_dict.items() if k != removed})
    code, _, err = run_main(cli, capsys, "--checkpoint", folder, "--output", tmp_path / "out")
    assert code == 1
    assert removed in err, f"stderr does not name {removed!r}:\n{err}"


def test_unsupported_attention_type(cli, capsys, tmp_path, official_config):
    folder = copy_checkpoint(tmp_path / "ckpt")
    config_path = folder / "llm" / "config.json"
    config_path.write_text(json.dumps({**official_config, "attn_type": "gpt2"}))
    code, _, err = run_main(cli, capsys, "--checkpoint", folder, "--output", tmp_path / "out")
    assert code == 1 and "attn_type" in err and "gpt2" in err
    assert not (tmp_path / "out" / "model_index.json").exists()


def test_unexpected_tokenizer_key(cli, capsys, tmp_path):
    folder = copy_checkpoint(tmp_path / "ckpt")
    path = folder / "tokenizer" / "model.safetensors"
    weights = load_file(path)
    weights["vae.bogus_layer.weight"] = torch.zeros(2)
    path.unlink()
    save_file(weights, path)
    code, _, err = run_main(cli, capsys, "--checkpoint", folder, "--output", tmp_path / "out")
    assert code == 1 and "bogus_layer.weight" in err


def test_usage_errors(cli, capsys, tmp_path):
    code, _, err = run_main(
        cli, capsys, "--checkpoint", CHECKPOINT, "--tokenizer", tmp_path, "--output", tmp_path / "out"
    )
    assert code == 2 and "--text-encoder" in err
    code, _, err = run_main(cli, capsys, "--checkpoint", tmp_path / "no_such_folder", "--output", tmp_path / "out")
    assert code == 2 and "no_such_folder" in err  # a missing checkpoint is a usage error (docs/cli.md)
    assert not (tmp_path / "out").exists()


def test_library_function_matches_the_script(cli_runs, official_config):
    """``load_original_hart_pipeline`` (what the script calls) loads the same weights as the written folder."""
    pipe = load_original_hart_pipeline(CHECKPOINT)
    saved = HARTPipeline.from_pretrained(cli_runs["plain"][1])
    for name in ("transformer", "vae"):
        a, b = getattr(pipe, name).state_dict(), getattr(saved, name).state_dict()
        assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a), name
    with pytest.raises(ValueError, match="attn_type='gpt2'"):
        hart_config_from_original({**official_config, "attn_type": "gpt2"})
