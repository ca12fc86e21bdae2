"""Infinity-8B checkpoints: the sharded folder (strict, shard by shard), the named configs against the official key
listings, and the converter on the 8B fixture (its command line: tests/lab/test_cli_commands.py) (sharded transformer + patch-8 VAE).

The fixture folder is ``tests/fixtures/infinity8b`` (``VAR_ACCEL_INFINITY8B_FIXTURE`` overrides it, as in
``test_parity_infinity8b.py``); the official key listings of the real 8B transformer and d56 VAE are in
``tests/fixtures/infinity8b_official_keys`` (copied from the fixture's FIXTURE.md folder).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from diffusers_var_accel import InfinityBSQVAE, InfinityPipeline, InfinityTransformer
from diffusers_var_accel.models.autoencoder_bsq import (
    INFINITY_VAE_D56_PATCHIFY_CONFIG,
    convert_infinity_vae_checkpoint,
    infer_infinity_vae_config,
)
from diffusers_var_accel.models.transformer_infinity import (
    INFINITY_CONFIGS,
    convert_infinity_checkpoint,
    infer_infinity_config,
)
from diffusers_var_accel.pipelines.infinity.convert import convert_infinity_original

from fixture_utils import official_call_kwargs, padded_text

FIXTURE_DIR = Path(
    os.environ.get("VAR_ACCEL_INFINITY8B_FIXTURE", Path(__file__).resolve().parents[1] / "fixtures" / "infinity8b")
)
KEYS_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "infinity8b_official_keys"
SHARDED = "infinity_tiny_sharded"
INDEX = "model.safetensors.index.json"


@pytest.fixture(scope="module")
def fixture():
    if not (FIXTURE_DIR / "manifest.json").is_file():
        pytest.fail(
            f"Infinity-8B fixture folder missing or incomplete: {FIXTURE_DIR} (set VAR_ACCEL_INFINITY8B_FIXTURE)"
        )
    manifest = json.loads((FIXTURE_DIR / "manifest.json").read_text())
    return manifest, load_file(FIXTURE_DIR / "inputs.safetensors"), load_file(FIXTURE_DIR / "reference.safetensors")


def _listing(name):
    """``{key: meta tensor of its shape}`` of an official key listing (``key<TAB>(shape)<TAB>dtype`` lines)."""
    path = KEYS_DIR / name
    if not path.is_file():
        pytest.fail(f"official key listing missing: {path}")
    out = {}
    for line in path.read_text().splitlines():
        if line.strip():
            key, shape, _ = line.split("\t")
            out[key] = torch.empty(tuple(int(v) for v in shape.strip("()[] ").split(",") if v.strip()), device="meta")
    return out


def _meta_state(cls, **config):
    with torch.device("meta"):
        model = cls(**config)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


# ---------------------------------------------------------------------------------------------------------------------
# named configs against the official listings (meta device)
# ---------------------------------------------------------------------------------------------------------------------
def test_named_8b_config_matches_the_official_key_listing():
    official = _listing("keys_official_infinity_8b.txt")
    assert len(official) == 862
    ours = _meta_state(InfinityTransformer, **INFINITY_CONFIGS["infinity-8b"])
    renamed = {k: tuple(v.shape) for k, v in convert_infinity_checkpoint(official).items()}
    assert sorted(set(renamed) - set(ours)) == [] and sorted(set(ours) - set(renamed)) == []
    assert {k: s for k, s in ours.items() if renamed[k] != s} == {}
    assert sum(torch.Size(s).numel() for s in ours.values()) == 8_376_082_128
    # the shapes alone give the named config back (but not the patchify flag: the converter reads it off the VAE)
    inferred = infer_infinity_config(official)
    named = INFINITY_CONFIGS["infinity-8b"]
    assert {k: inferred[k] for k in named if k in inferred} == {k: named[k] for k in named if k in inferred}


def test_d56_vae_config_matches_the_official_key_listing():
    official = _listing("keys_official_vae_d56_patchify.txt")
    assert len(official) == 226
    ours = _meta_state(InfinityBSQVAE, **INFINITY_VAE_D56_PATCHIFY_CONFIG)
    renamed = {k: tuple(v.shape) for k, v in convert_infinity_vae_checkpoint(official, ours, codebook_dim=14).items()}
    assert sorted(set(renamed) ^ set(ours)) == []
    assert {k: s for k, s in ours.items() if renamed[k] != s} == {}
    assert sum(torch.Size(s).numel() for s in ours.values()) + 2 * 14 == 81_624_237  # + the two lfq.mask buffers
    assert infer_infinity_vae_config(official) == INFINITY_VAE_D56_PATCHIFY_CONFIG


# ---------------------------------------------------------------------------------------------------------------------
# sharded folder: strict, shard by shard
# ---------------------------------------------------------------------------------------------------------------------
def _copy_sharded(tmp_path):
    folder = tmp_path / "sharded"
    shutil.copytree(FIXTURE_DIR / SHARDED, folder)
    for f in folder.iterdir():
        f.chmod(0o644)
    return folder, json.loads((folder / INDEX).read_text())


def _rewrite(folder, index, shard, edit):
    tensors = load_file(folder / shard)
    edit(tensors)
    save_file(tensors, folder / shard)
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if v != shard}
    index["weight_map"].update({k: shard for k in tensors})
    (folder / INDEX).write_text(json.dumps(index))


def test_sharded_folder_lists_every_bad_key(fixture, tmp_path):
    folder, index = _copy_sharded(tmp_path)
    shard = sorted(set(index["weight_map"].values()))[-1]
    victims = [k for k, v in index["weight_map"].items() if v == shard][:3]

    def edit(t):
        t["renamed." + victims[0]] = t.pop(victims[0])  # one missing + one unexpected
        t[victims[1]] = torch.zeros(*t[victims[1]].shape, 3)  # one mis-shaped
        del t[victims[2]]  # one more missing

    _rewrite(folder, index, shard, edit)
    with pytest.raises(ValueError) as err:
        InfinityTransformer.from_original_checkpoint(folder, apply_spatial_patchify=True)
    msg = str(err.value)
    assert "missing keys (2)" in msg and "unexpected keys (1)" in msg and "mis-shaped keys (1)" in msg, msg
    assert "renamed." + victims[0] in msg and str(folder) in msg


def test_sharded_folder_missing_or_corrupt_shard_names_the_file(fixture, tmp_path):
    folder, index = _copy_sharded(tmp_path)
    shards = sorted(set(index["weight_map"].values()))
    data = (folder / shards[0]).read_bytes()
    (folder / shards[0]).write_bytes(data[: len(data) // 2])  # truncated
    with pytest.raises(ValueError, match=shards[0]):
        InfinityTransformer.from_original_checkpoint(folder, apply_spatial_patchify=True)
    (folder / shards[0]).write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match=shards[0]):
        InfinityTransformer.from_original_checkpoint(folder, apply_spatial_patchify=True)
    (folder / shards[0]).unlink()
    with pytest.raises(FileNotFoundError, match=shards[0]):
        InfinityTransformer.from_original_checkpoint(folder, apply_spatial_patchify=True)
    (folder / INDEX).write_text("{not json")
    with pytest.raises(ValueError, match=INDEX):
        InfinityTransformer.from_original_checkpoint(folder)
    (folder / INDEX).unlink()
    with pytest.raises(FileNotFoundError, match=INDEX):
        InfinityTransformer.from_original_checkpoint(folder)


def test_sharded_folder_whose_shard_disagrees_with_the_index(fixture, tmp_path):
    folder, index = _copy_sharded(tmp_path)
    shard = sorted(set(index["weight_map"].values()))[0]
    moved = next(k for k, v in index["weight_map"].items() if v == shard)
    index["weight_map"][moved] = sorted(set(index["weight_map"].values()))[-1]
    (folder / INDEX).write_text(json.dumps(index))
    with pytest.raises(ValueError, match=f"{shard}|{moved}"):
        InfinityTransformer.from_original_checkpoint(folder, apply_spatial_patchify=True)


def test_sharded_load_reads_each_shard_once_into_a_meta_built_model(fixture, monkeypatch):
    """No full state dict is built: every tensor is read once, shard by shard, and the model starts on meta."""
    import safetensors

    reads = []
    real_open = safetensors.safe_open

    class Spy:
        def __init__(self, path, **kw):
            self.f, self.path = real_open(path, **kw), path

        def __enter__(self):
            self.f.__enter__()
            return self

        def __exit__(self, *a):
            return self.f.__exit__(*a)

        def keys(self):
            return self.f.keys()

        def get_slice(self, k):
            return self.f.get_slice(k)

        def get_tensor(self, k):
            reads.append((Path(self.path).name, k))
            return self.f.get_tensor(k)

    monkeypatch.setattr(safetensors, "safe_open", Spy)
    model = InfinityTransformer.from_original_checkpoint(
        FIXTURE_DIR / SHARDED, apply_spatial_patchify=True, torch_dtype=torch.bfloat16
    )
    index = json.loads((FIXTURE_DIR / SHARDED / INDEX).read_text())["weight_map"]
    assert sorted(reads) == sorted((v, k) for k, v in index.items()) and len(set(reads)) == len(reads)
    assert [name for name, _ in reads] == sorted(name for name, _ in reads)  # shard by shard
    assert all(not p.is_meta for p in model.state_dict().values())
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


# ---------------------------------------------------------------------------------------------------------------------
# converter and CLI on the 8B layout
# ---------------------------------------------------------------------------------------------------------------------
def _greedy_latents(pipe, fixture):
    manifest, inputs, _ = fixture
    embeds, mask = padded_text(inputs)
    return pipe(
        **official_call_kwargs(manifest, manifest["runs"]["greedy_cfg"]["call"], embeds, mask), output_type="latent"
    ).images


def test_convert_sharded_folder_and_patchify_vae(fixture, tmp_path):
    manifest, _, ref = fixture
    pipe = convert_infinity_original(FIXTURE_DIR / SHARDED, FIXTURE_DIR / "vae_tiny.pth")
    assert pipe.transformer.config.apply_spatial_patchify is True
    assert pipe.vae.config.patch_size == manifest["vae_kwargs"]["vae_model_args"]["patch_size"]
    pipe.save_pretrained(tmp_path / "out")
    reloaded = InfinityPipeline.from_pretrained(tmp_path / "out")
    reloaded.set_progress_bar_config(disable=True)
    assert reloaded.transformer.token_patch_size == 2
    torch.testing.assert_close(_greedy_latents(reloaded, fixture), ref["greedy_cfg.summed_codes"], atol=1e-6, rtol=0)


def test_convert_patchify_mismatches_are_errors(fixture):
    # the 8B transformer with the 2B fixture's d16-style VAE: bits per token do not fit
    two_b_vae = Path(__file__).resolve().parents[1] / "fixtures" / "infinity" / "vae_tiny.pth"
    with pytest.raises(ValueError, match="bits per token"):
        convert_infinity_original(FIXTURE_DIR / "infinity_tiny.pth", two_b_vae)
    with pytest.raises(FileNotFoundError, match="sharded folder"):
        convert_infinity_original(FIXTURE_DIR / "no_such_folder", FIXTURE_DIR / "vae_tiny.pth")
