"""Tests of HART's hybrid tokenizer against the golden fixture of the official code (see the fixture's FIXTURE.md).

Everything is read from the fixture folder (``tests/fixtures/hart``, or ``$VAR_ACCEL_HART_FIXTURE``); a missing folder
fails the tests. Scale sizes come from the stored token ids, runs from ``manifest.json``.
"""

import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from diffusers_var_accel.models.autoencoder_hart import (
    HARTHybridTokenizer,
    hart_tokenizer_config_from_original,
)

FIXTURE_ENV = "VAR_ACCEL_HART_FIXTURE"
IMAGE_ATOL = 1e-4  # FIXTURE.md: image, greedy / plain runs
F_HAT_ATOL = 1e-4  # per-scale f_hat rebuilt from the recorded ids (hard codebook codes)
UNUSED_KEYS = ("vae.quantize.ema_vocab_hit_SV",)


@pytest.fixture(scope="module")
def fixture_dir():
    path = Path(os.environ.get(FIXTURE_ENV, Path(__file__).resolve().parents[1] / "fixtures" / "hart"))
    if not (path / "manifest.json").is_file():
        pytest.fail(f"HART fixture folder {path} (or its manifest.json) is missing; set {FIXTURE_ENV}")
    return path


@pytest.fixture(scope="module")
def tokenizer_dir(fixture_dir):
    return fixture_dir / "hart-tiny" / "tokenizer"


@pytest.fixture(scope="module")
def manifest(fixture_dir):
    with open(fixture_dir / "manifest.json") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def references(fixture_dir, manifest):
    return {run: load_file(str(fixture_dir / f"ref_{run}.safetensors")) for run in manifest["runs"]}


@pytest.fixture(scope="module")
def original_config(tokenizer_dir):
    with open(tokenizer_dir / "config.json") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def raw_state_dict(tokenizer_dir):
    return load_file(str(tokenizer_dir / "model.safetensors"))


@pytest.fixture(scope="module")
def tok(tokenizer_dir):
    return HARTHybridTokenizer.from_original_folder(tokenizer_dir)


def _scale_sides(ref):
    """Side of every scale, from the stored ids ``idx_s{s}`` of shape (B, side**2)."""
    num_scales = len([k for k in ref if re.fullmatch(r"idx_s\d+", k)])
    sides = [round(ref[f"idx_s{s}"].shape[1] ** 0.5) for s in range(num_scales)]
    assert all(side * side == ref[f"idx_s{s}"].shape[1] for s, side in enumerate(sides))
    return sides


def _rebuild(tok, ref, sides, upto):
    """f_hat after scales 0..upto (all before the last), from the recorded ids."""
    f_hat = None
    final = sides[-1]
    for s in range(upto + 1):
        codes = tok.indices_to_codes(ref[f"idx_s{s}"], sides[s], sides[s])
        f_hat = tok.add_scale_codes(f_hat, codes, s, len(sides), final)
    return f_hat


# ---------------------------------------------------------------------------------------------------- loading


def test_load_matches_file(tok, raw_state_dict):
    ours = tok.state_dict()
    expected = {
        k[len("vae.") :]: v for k, v in raw_state_dict.items() if k.startswith("vae.") and k not in UNUSED_KEYS
    }
    assert set(ours) == set(expected)
    for key, value in expected.items():
        assert torch.equal(ours[key], value), key
    assert not tok.training
    assert tok.config.quant_resi == 0.5 and tok.config.share_quant_resi == 4 and tok.config.num_res_blocks == 2


def test_strict_missing_key(tokenizer_dir, raw_state_dict, tmp_path):
    removed = "vae.decoder.mid.attn_1.proj_out.weight"
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    shutil.copy(tokenizer_dir / "config.json", folder / "config.json")
    save_file({k: v for k, v in raw_state_dict.items() if k != removed}, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match=re.escape(removed[len("vae.") :])):
        HARTHybridTokenizer.from_original_folder(folder)


def test_strict_extra_key_and_dropped_keys(tokenizer_dir, raw_state_dict, original_config, tmp_path):
    extra = dict(raw_state_dict)
    extra["vae.decoder.not_a_layer.weight"] = torch.zeros(3)
    with pytest.raises(ValueError, match=re.escape("decoder.not_a_layer.weight")):
        HARTHybridTokenizer.from_original_state_dict(extra, original_config)
    # A key outside vae.* / disc.* is reported too, never silently used.
    outside = dict(raw_state_dict)
    outside["decoder.conv_in.weight"] = raw_state_dict["vae.decoder.conv_in.weight"]
    with pytest.raises(ValueError, match=re.escape("decoder.conv_in.weight")):
        HARTHybridTokenizer.from_original_state_dict(outside, original_config)
    # The discriminator and the usage statistics are dropped; a pickle is read with weights_only=True.
    with_disc = dict(raw_state_dict)
    with_disc["disc.main.0.weight"] = torch.zeros(4, 3, 4, 4)
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    shutil.copy(tokenizer_dir / "config.json", folder / "config.json")
    torch.save(with_disc, folder / "pytorch_model.bin")
    loaded = HARTHybridTokenizer.from_original_folder(folder)
    assert all(torch.equal(v, raw_state_dict[f"vae.{k}"]) for k, v in loaded.state_dict().items())


def test_unsupported_configs_raise(tokenizer_dir, original_config, raw_state_dict, tmp_path):
    for changes, message in (
        ({"quantizer_type": "var"}, "quantizer_type"),
        ({"double_decoder": True}, "double_decoder"),
        ({"share_quant_resi": 1}, "share_quant_resi"),
        ({"model_type": "hart_transformer_t2i"}, "model_type"),
    ):
        with pytest.raises(ValueError, match=message):
            hart_tokenizer_config_from_original({**original_config, **changes})
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    with open(folder / "config.json", "w") as f:
        json.dump({**original_config, "quantizer_type": "var"}, f)
    shutil.copy(tokenizer_dir / "model.safetensors", folder / "model.safetensors")
    with pytest.raises(ValueError, match="quantizer_type"):
        HARTHybridTokenizer.from_original_folder(folder)


def test_config_mapping(original_config, tok):
    config = hart_tokenizer_config_from_original(original_config)
    for name in ("vocab_size", "z_channels", "ch", "quant_resi", "share_quant_resi", "using_znorm", "quant_conv_ks"):
        assert config[name] == original_config[name], name
    assert list(config["ch_mult"]) == list(original_config["ch_mult"])
    assert list(config["v_patch_nums"]) == list(original_config["v_patch_nums"])
    assert tok.quantize.embedding.weight.shape == (original_config["vocab_size"], original_config["z_channels"])


# ---------------------------------------------------------------------------------------------------- against the fixture


def test_decode_matches_reference_images(tok, references):
    checked = 0
    for run, ref in references.items():
        if "f_hat_final" not in ref or "image" not in ref:
            continue
        with torch.no_grad():
            image = tok.decode(ref["f_hat_final"]) * 0.5 + 0.5
        torch.testing.assert_close(image, ref["image"], atol=IMAGE_ATOL, rtol=0, msg=lambda m: f"{run}: {m}")
        checked += 1
    assert checked > 0, "no run stores f_hat_final and image"


def test_f_hat_per_scale_from_indices(tok, references):
    runs = [run for run, ref in references.items() if any(k.startswith("f_hat_after_s") for k in ref)]
    if not runs:
        pytest.skip("no run of this fixture stores f_hat_after_s* (greedy, cfg != 0 runs do)")
    for run in runs:
        ref = references[run]
        sides = _scale_sides(ref)
        f_hat = None
        for s in range(len(sides) - 1):
            before = f_hat
            codes = tok.indices_to_codes(ref[f"idx_s{s}"], sides[s], sides[s])
            with torch.no_grad():
                f_hat = tok.add_scale_codes(f_hat, codes, s, len(sides), sides[-1])
            if before is not None:
                assert f_hat is not before
            if f"f_hat_after_s{s}" in ref:
                torch.testing.assert_close(
                    f_hat, ref[f"f_hat_after_s{s}"], atol=F_HAT_ATOL, rtol=0, msg=lambda m: f"{run} scale {s}: {m}"
                )


def test_f_hat_final_from_indices_and_diffusion_output(tok, references, manifest):
    """For runs with hard codes (more_smooth=False), f_hat_final = scales 0..S-2 + (codes of S-1 + diff_out[:N])."""
    checked = 0
    for run, ref in references.items():
        call = manifest["runs"][run].get("call", {})
        if not isinstance(call, dict) or call.get("more_smooth", True) or "diff_out" not in ref:
            continue
        sides = _scale_sides(ref)
        side = sides[-1]
        with torch.no_grad():
            f_hat = _rebuild(tok, ref, sides, len(sides) - 2)
            B, Cv = f_hat.shape[:2]
            residual = (
                ref["diff_out"][: B * side * side]
                .reshape(B, side * side, Cv)
                .transpose(1, 2)
                .reshape(B, Cv, side, side)
            )
            last = tok.indices_to_codes(ref[f"idx_s{len(sides) - 1}"], side, side) + residual
            f_hat = tok.add_scale_codes(f_hat, last, len(sides) - 1, len(sides), side)
        torch.testing.assert_close(f_hat, ref["f_hat_final"], atol=F_HAT_ATOL, rtol=0, msg=lambda m: f"{run}: {m}")
        checked += 1
    assert checked > 0, "no run with more_smooth=False stores diff_out"


# ---------------------------------------------------------------------------------------------------- helpers


def test_phi_index_rule(tok):
    # ARCHITECTURE.md section 4 step 7, SN = 14: si 0-2 -> 0, 3-6 -> 1, 7-10 -> 2, 11-13 -> 3.
    assert [tok.phi_index(si, 14) for si in range(14)] == [0] * 3 + [1] * 4 + [2] * 4 + [3] * 3
    assert [tok.phi_index(si, 8) for si in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert tok.phi_index(0, 1) == 0
    with pytest.raises(ValueError):
        tok.phi_index(3, 3)


def test_add_scale_codes_semantics(tok):
    torch.manual_seed(0)
    Cv = tok.config.z_channels
    codes = torch.randn(2, Cv, 3, 3)
    with torch.no_grad():
        first = tok.add_scale_codes(None, codes, 1, 5, 8)
        up = F.interpolate(codes, size=(8, 8), mode="bicubic", align_corners=False)
        phi = tok.quantize.quant_resi.qresi_ls[tok.phi_index(1, 5)]
        torch.testing.assert_close(
            first, 0.5 * up + 0.5 * phi._conv_forward(up, phi.weight, phi.bias), atol=1e-6, rtol=0
        )
        assert first.dtype == codes.dtype
        snapshot = first.clone()
        last_codes = torch.randn(2, Cv, 8, 8)
        final = tok.add_scale_codes(first, last_codes, 4, 5, (8, 8))
    assert torch.equal(first, snapshot)  # the caller's f_hat is untouched
    assert torch.equal(final, first + last_codes)  # last scale: no Phi, no interpolation
    with pytest.raises(ValueError, match="final size"):
        tok.add_scale_codes(first, codes, 4, 5, 8)


def test_indices_and_next_scale_input_layout(tok):
    torch.manual_seed(0)
    idx = torch.randint(0, tok.config.vocab_size, (2, 6))
    codes = tok.indices_to_codes(idx, 2, 3)
    assert codes.shape == (2, tok.config.z_channels, 2, 3)
    assert torch.equal(codes[1, :, 1, 2], tok.quantize.embedding.weight[idx[1, 5]])  # row-major
    f_hat = torch.randn(2, tok.config.z_channels, 8, 8)
    same = tok.next_scale_input(f_hat, 8)
    assert same.shape == (2, 64, tok.config.z_channels)
    assert torch.equal(same[0, 8 * 3 + 5], f_hat[0, :, 3, 5])
    torch.testing.assert_close(tok.next_scale_input(f_hat, 1)[:, 0], f_hat.mean(dim=(2, 3)))
    torch.testing.assert_close(
        tok.next_scale_input(f_hat, (4, 4)).transpose(1, 2).reshape(2, -1, 4, 4), F.avg_pool2d(f_hat, 2)
    )


def test_encode_quantize_round_trip(tok, references):
    sides = _scale_sides(next(iter(references.values())))
    factor = tok.downsample_factor
    torch.manual_seed(0)
    image = torch.rand(2, 3, sides[-1] * factor, sides[-1] * factor) * 2 - 1
    with torch.no_grad():
        indices, residual = tok.encode_to_indices(image, sides, return_residual=True)
        assert [tuple(i.shape) for i in indices] == [(2, s * s) for s in sides]
        assert all(i.dtype == torch.long and 0 <= i.min() and i.max() < tok.config.vocab_size for i in indices)
        f_hat = _rebuild(tok, {f"idx_s{s}": i for s, i in enumerate(indices)}, sides, len(sides) - 2)
        last = tok.indices_to_codes(indices[-1], sides[-1], sides[-1])
        discrete = tok.add_scale_codes(f_hat, last, len(sides) - 1, len(sides), sides[-1])
        # The latent is exactly the discrete f_hat plus the continuous residual.
        torch.testing.assert_close(discrete + residual, tok.encode(image), atol=1e-5, rtol=0)
        assert tok.decode(discrete).shape == image.shape
        # The first scale takes the code nearest to the latent's mean.
        mean = tok.encode(image).mean(dim=(2, 3))
        nearest = torch.cdist(mean, tok.quantize.embedding.weight).argmin(dim=1)
        assert torch.equal(indices[0][:, 0], nearest)


def test_quantize_recovers_constructed_tokens():
    """With identity Phi and a codebook of one large and many small codes, a latent built from known tokens
    (a 1x1 scale of large codes + a full-size map of small codes) is re-tokenised exactly, with zero residual."""
    torch.manual_seed(0)
    Cv, V, side = 4, 16, 4
    tok = HARTHybridTokenizer(vocab_size=V, z_channels=Cv, ch=32, ch_mult=(1, 1))
    with torch.no_grad():
        for phi in tok.quantize.quant_resi.qresi_ls:
            phi.weight.zero_()
            phi.weight[:, :, 1, 1] = torch.eye(Cv)
            phi.bias.zero_()
        codebook = torch.zeros(V, Cv)
        codebook[:4] = 10.0 * torch.eye(Cv)  # "coarse" codes
        codebook[4:] = 0.05 * torch.randn(V - 4, Cv)  # "fine" codes
        tok.quantize.embedding.weight.copy_(codebook)
        coarse = torch.tensor([[2], [1]])
        fine = torch.randint(4, V, (2, side * side))
        f = tok.add_scale_codes(None, tok.indices_to_codes(coarse, 1, 1), 0, 2, side)
        f = tok.add_scale_codes(f, tok.indices_to_codes(fine, side, side), 1, 2, side)
        indices, residual = tok.quantize_latent(f, [1, side], return_residual=True)
    assert torch.equal(indices[0], coarse) and torch.equal(indices[1], fine)
    assert residual.abs().max() < 1e-5


def test_save_pretrained_round_trip(tok, tmp_path):
    tok.save_pretrained(tmp_path / "tok")
    again = HARTHybridTokenizer.from_pretrained(tmp_path / "tok")
    assert again.config.share_quant_resi == tok.config.share_quant_resi
    z = torch.randn(1, tok.config.z_channels, 4, 4)
    with torch.no_grad():
        assert torch.equal(again.decode(z), tok.decode(z))
