"""Tests of the Infinity BSQ VAE against the golden fixture of the official code (see the fixture's FIXTURE.md).

Everything is read from the fixture folder (``tests/fixtures/infinity``, or ``$VAR_ACCEL_INFINITY_FIXTURE``); a missing
folder fails the tests. Only the items a fixture stores are checked.
"""

import json
import os
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from diffusers_var_accel.models.autoencoder_bsq import (
    InfinityBSQVAE,
    convert_infinity_vae_checkpoint,
    infer_infinity_vae_config,
)

FIXTURE_ENV = "VAR_ACCEL_INFINITY_FIXTURE"
DECODE_ATOL = 1e-3  # FIXTURE.md: decoded floats
CODES_ATOL = 1e-6  # FIXTURE.md: next inputs / summed codes
DECODED_SUM_RTOL = 1e-4  # FIXTURE.md: decoded per-sample sums, relative to the abs-sum
MASK_KEYS = ("quantizer.lfq.mask", "quantize.lfq.mask")


def _plain_name(key):
    """Official wrapped name -> plain name, written independently of the library's converter."""
    return re.sub(r"\.(conv|norm)\.(weight|bias)$", r".\2", key)


@pytest.fixture(scope="module")
def fixture_dir():
    path = Path(os.environ.get(FIXTURE_ENV, Path(__file__).resolve().parents[1] / "fixtures" / "infinity"))
    if not (path / "manifest.json").is_file():
        pytest.fail(f"Infinity fixture folder {path} (or its manifest.json) is missing; set {FIXTURE_ENV}")
    return path


@pytest.fixture(scope="module")
def manifest(fixture_dir):
    with open(fixture_dir / "manifest.json") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def reference(fixture_dir):
    return load_file(str(fixture_dir / "reference.safetensors"))


@pytest.fixture(scope="module")
def schedule(manifest):
    return [tuple(s) for s in manifest["scale_schedule"]]


@pytest.fixture(scope="module")
def raw_state_dict(fixture_dir):
    obj = torch.load(fixture_dir / "vae_tiny.pth", map_location="cpu", weights_only=True)
    return obj["vae"] if "vae" in obj else obj


@pytest.fixture(scope="module")
def vae(fixture_dir):
    return InfinityBSQVAE.from_original_checkpoint(fixture_dir / "vae_tiny.pth")


def _public_config(model):
    return {k: list(v) if isinstance(v, tuple) else v for k, v in model.config.items() if not k.startswith("_")}


def _runs_with(manifest, reference, item):
    return [run for run in manifest["runs"] if f"{run}.{item}" in reference]


# 1. Loading -------------------------------------------------------------------------------------------------------


def test_load_matches_file_and_manifest(vae, raw_state_dict, manifest):
    model_sd = vae.state_dict()
    weights = {k: v for k, v in raw_state_dict.items() if k not in MASK_KEYS}
    assert {_plain_name(k) for k in weights} == set(model_sd)
    assert len(weights) == len(model_sd)
    for key in set(raw_state_dict) - set(weights):  # the dropped quantiser buffers
        assert raw_state_dict[key].shape == (vae.config.codebook_dim,), key
    for key, value in weights.items():
        assert torch.equal(model_sd[_plain_name(key)], value.float()), key
    assert not vae.training

    kwargs = manifest["vae_kwargs"]
    args = {**kwargs["vae_model_args"], **kwargs["overridden_autoencoder_args"]}
    config = vae.config
    assert config.codebook_dim == args["codebook_dim"]
    assert 2**config.codebook_dim == args["codebook_size"]
    assert list(config.encoder_ch_mult) == list(args["encoder_ch_mult"])
    assert list(config.decoder_ch_mult) == list(args["decoder_ch_mult"])
    assert config.patch_size == args["patch_size"]
    assert config.base_ch == args["base_ch"]
    assert config.num_res_blocks == args["num_res_blocks"]
    assert config.codebook_dim == manifest["codebook_dim"]


def test_load_plain_names_safetensors_and_dict(vae, raw_state_dict, tmp_path):
    plain = {_plain_name(k): v.clone() for k, v in raw_state_dict.items()}
    path = tmp_path / "vae_plain.safetensors"
    save_file(plain, str(path))
    from_file = InfinityBSQVAE.from_original_checkpoint(path)

    wrapped = {k: v.clone() for k, v in raw_state_dict.items()}
    from_dict = InfinityBSQVAE.from_original_checkpoint(wrapped, config=vae.config)
    from_dict64 = InfinityBSQVAE.from_original_checkpoint(wrapped, torch_dtype=torch.float64)
    assert set(wrapped) == set(raw_state_dict)  # the user's dict is not modified
    # the model does not share storage with the user's dict
    user_ptrs = {v.data_ptr() for v in wrapped.values()}
    assert not user_ptrs & {p.data_ptr() for p in from_dict.parameters()}

    for key, value in vae.state_dict().items():
        assert torch.equal(from_file.state_dict()[key], value), key
        assert torch.equal(from_dict.state_dict()[key], value), key
        assert from_dict64.state_dict()[key].dtype == torch.float64
        assert torch.equal(from_dict64.state_dict()[key], value.double()), key


# 2. Decoder parity ------------------------------------------------------------------------------------------------


@torch.no_grad()
def test_decode_matches_reference(vae, manifest, reference):
    r0, c0 = manifest["decoded_crop32_origin_rc"]
    checked = 0
    for run in _runs_with(manifest, reference, "summed_codes"):
        sub4, crop = reference.get(f"{run}.decoded_sub4"), reference.get(f"{run}.decoded_crop32_s0")
        summary = manifest["runs"][run].get("summary", {})
        sums = summary.get("decoded_sum_per_sample")
        if sub4 is None and crop is None and sums is None:
            continue
        image = vae.decode(reference[f"{run}.summed_codes"])
        if sub4 is not None:
            torch.testing.assert_close(image[:, :, ::4, ::4], sub4, atol=DECODE_ATOL, rtol=0)
            checked += 1
        if crop is not None:
            torch.testing.assert_close(image[:1, :, r0 : r0 + 32, c0 : c0 + 32], crop, atol=DECODE_ATOL, rtol=0)
            checked += 1
        if sums is not None:
            for b, expected in enumerate(sums):
                err = abs(image[b].double().sum().item() - expected)
                assert err <= DECODED_SUM_RTOL * summary["decoded_abs_sum_per_sample"][b], (run, b, err)
            checked += 1
    assert checked > 0, "the fixture stores no decoded reference"


# 3. Bits -> codes -> f_hat ------------------------------------------------------------------------------------------


def test_bits_to_summed_codes_and_next_inputs(vae, manifest, reference, schedule):
    num_scales = len(schedule)
    checked = 0
    for run in _runs_with(manifest, reference, "summed_codes"):
        if not all(f"{run}.bits.{si}" in reference for si in range(num_scales)):
            continue
        f_hat = None
        for si in range(num_scales):
            if si > 0 and f"{run}.next_input.{si}" in reference:
                x_Bld = vae.next_scale_input(f_hat, schedule[si])
                torch.testing.assert_close(x_Bld, reference[f"{run}.next_input.{si}"], atol=CODES_ATOL, rtol=0)
                checked += 1
            bits = reference[f"{run}.bits.{si}"]
            codes = vae.bits_to_codes(bits)
            assert codes.shape == (bits.shape[0], vae.config.codebook_dim, *schedule[si][1:])
            f_hat = vae.add_scale_codes(f_hat, codes, schedule[-1], is_last_scale=si == num_scales - 1)
        torch.testing.assert_close(f_hat, reference[f"{run}.summed_codes"], atol=CODES_ATOL, rtol=0)
        checked += 1
    assert checked > 0, "the fixture stores no bits with summed codes"


def test_bits_layouts_agree(vae, reference, manifest, schedule):
    run = _runs_with(manifest, reference, "bits.0")[0]
    bits = reference[f"{run}.bits.{len(schedule) - 1}"]
    codes = vae.bits_to_codes(bits)
    assert torch.equal(vae.bits_to_codes(bits.squeeze(1)), codes)
    assert torch.equal(vae.bits_to_codes(bits.bool()), codes)
    assert torch.equal(vae.bits_to_codes(bits.long()), codes)
    d = vae.config.codebook_dim
    torch.testing.assert_close(codes.abs(), torch.full_like(codes, d**-0.5), atol=1e-7, rtol=0)
    with pytest.raises(ValueError, match="bits"):
        vae.bits_to_codes(bits[..., :-1])
    with pytest.raises(ValueError, match="final size"):
        vae.add_scale_codes(None, vae.bits_to_codes(reference[f"{run}.bits.0"]), schedule[-1], is_last_scale=True)


@pytest.mark.parametrize("codebook_dim", [4, 32, 56])
def test_bits_to_codes_lookup_equals_formula(codebook_dim):
    # The per-call lookup of the two un-normalised codes gives the formula's codes bit for bit, for any bits, shapes
    # and integer dtypes; other dtypes and layouts take the formula itself.
    vae = InfinityBSQVAE(
        codebook_dim=codebook_dim, base_ch=32, encoder_ch_mult=[1], decoder_ch_mult=[1], num_res_blocks=1, patch_size=1
    )
    generator = torch.Generator().manual_seed(codebook_dim)
    values = vae.bit_code_values()
    for shape in [(1, 1, 1), (2, 3, 5), (1, 16, 16), (3, 1, 1, 7)]:
        bits = torch.randint(0, 2, (*shape, codebook_dim), generator=generator)
        d_scale = 1.0 / codebook_dim**0.5
        formula = (
            torch.nn.functional.normalize(bits.float() * (2.0 * d_scale) - d_scale, dim=-1).permute(0, 3, 1, 2)
            if bits.ndim == 4
            else None
        )
        reference = vae.bits_to_codes(bits)
        if formula is not None:
            assert torch.equal(reference, formula)
        for dtype in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.bool, torch.float32):
            looked_up = vae.bits_to_codes(bits.to(dtype), bit_code_values=values)
            assert looked_up.dtype == reference.dtype and torch.equal(looked_up, reference), (shape, dtype)
        permuted = bits.transpose(1, 2).contiguous().transpose(1, 2) if bits.ndim == 4 else bits
        assert torch.equal(vae.bits_to_codes(permuted, bit_code_values=values), reference)
    # every bit of a code row set gives +-1/sqrt(d) before normalisation: the table holds exactly those two values
    assert torch.equal(values, torch.tensor([0.0, 1.0]) * (2.0 / codebook_dim**0.5) - 1.0 / codebook_dim**0.5)
    with pytest.raises(ValueError, match="bit_code_values"):
        vae.bits_to_codes(torch.zeros(1, 2, 2, codebook_dim, dtype=torch.long), bit_code_values=values.double())


# 4. Strict loading ------------------------------------------------------------------------------------------------


def _weight_keys(raw_state_dict):
    return sorted(k for k in raw_state_dict if k not in MASK_KEYS)


def test_strict_missing_key(raw_state_dict):
    removed = _weight_keys(raw_state_dict)[len(raw_state_dict) // 2]
    broken = {k: v for k, v in raw_state_dict.items() if k != removed}
    with pytest.raises(ValueError, match=re.escape(_plain_name(removed))):
        InfinityBSQVAE.from_original_checkpoint(broken)


def test_strict_unexpected_key(raw_state_dict):
    extra = "decoder.mid.block_3.conv1.conv.weight"
    broken = {**raw_state_dict, extra: torch.zeros(1)}
    with pytest.raises(ValueError, match=re.escape(extra)):
        InfinityBSQVAE.from_original_checkpoint(broken)


def test_strict_shape_mismatch(raw_state_dict, vae):
    key = next(k for k in _weight_keys(raw_state_dict) if k.endswith("conv2.conv.bias"))
    broken = {**raw_state_dict, key: torch.zeros(raw_state_dict[key].shape[0] + 1)}
    # config given, so that the mismatch is found by the strict check and not by the config inference
    with pytest.raises(ValueError, match=re.escape(_plain_name(key))):
        InfinityBSQVAE.from_original_checkpoint(broken, config=vae.config)


def test_strict_lists_every_problem_at_once(raw_state_dict, vae):
    keys = _weight_keys(raw_state_dict)
    removed, resized, extra = keys[1], next(k for k in keys if k.endswith("norm2.norm.weight")), "encoder.extra.weight"
    broken = {k: v for k, v in raw_state_dict.items() if k != removed}
    broken[resized] = torch.zeros(3)
    broken[extra] = torch.zeros(2)
    with pytest.raises(ValueError) as info:
        InfinityBSQVAE.from_original_checkpoint(broken, config=vae.config)
    message = str(info.value)
    for name in (_plain_name(removed), _plain_name(resized), extra):
        assert name in message, name


def test_strict_mask_shape_and_config_keys(raw_state_dict, vae):
    broken = {**raw_state_dict, MASK_KEYS[0]: torch.zeros(vae.config.codebook_dim + 1, dtype=torch.int64)}
    with pytest.raises(ValueError, match=re.escape(MASK_KEYS[0])):
        InfinityBSQVAE.from_original_checkpoint(broken)
    with pytest.raises(ValueError, match="not_an_argument"):
        InfinityBSQVAE.from_original_checkpoint(raw_state_dict, config={**vae.config, "not_an_argument": 1})


def test_converter_and_inference_are_reusable(raw_state_dict, vae):
    converted = convert_infinity_vae_checkpoint(raw_state_dict, vae.state_dict())
    assert set(converted) == set(vae.state_dict())
    assert infer_infinity_vae_config(raw_state_dict) == _public_config(vae)


# 5. save_pretrained / from_pretrained -----------------------------------------------------------------------------


@torch.no_grad()
def test_save_pretrained_round_trip(vae, reference, manifest, tmp_path):
    run = _runs_with(manifest, reference, "summed_codes")[0]
    z = reference[f"{run}.summed_codes"][:, :, :4, :4].contiguous()  # a small latent keeps the test fast
    vae.save_pretrained(tmp_path)
    reloaded = InfinityBSQVAE.from_pretrained(tmp_path)
    assert _public_config(reloaded) == _public_config(vae)
    assert torch.equal(reloaded.decode(z), vae.decode(z))


# 6. Encoder-side multi-scale quantisation --------------------------------------------------------------------------


@torch.no_grad()
def test_quantize_multiscale(vae, reference, manifest, schedule):
    run = _runs_with(manifest, reference, "summed_codes")[0]
    z = vae.encode(vae.decode(reference[f"{run}.summed_codes"]))
    d = vae.config.codebook_dim
    assert z.shape == reference[f"{run}.summed_codes"].shape

    bits = vae.quantize_multiscale(z, schedule)
    assert len(bits) == len(schedule)
    f_hat = None
    for si, (b, (_, h, w)) in enumerate(zip(bits, schedule)):
        assert b.shape == (z.shape[0], 1, h, w, d) and b.dtype == torch.uint8
        assert set(b.unique().tolist()) <= {0, 1}
        f_hat = vae.add_scale_codes(f_hat, vae.bits_to_codes(b), schedule[-1], is_last_scale=si == len(schedule) - 1)
    # the multi-scale codes approximate the latent better than the zero latent does
    assert (z - f_hat).norm() < z.norm()

    # (h, w) and (1, h, w) schedule entries are the same
    bits_hw = vae.quantize_multiscale(z, [s[1:] for s in schedule])
    assert all(torch.equal(a, b) for a, b in zip(bits, bits_hw))
    with pytest.raises(ValueError, match="time size"):
        vae.quantize_multiscale(z, [(2, 1, 1)])


def test_input_checks(vae):
    d = vae.config.codebook_dim
    with pytest.raises(ValueError, match="decode"):
        vae.decode(torch.zeros(1, d + 1, 2, 2))
    with pytest.raises(ValueError, match="encode"):
        vae.encode(torch.zeros(1, 3, 16))
    with pytest.raises(ValueError, match="power of 2"):
        InfinityBSQVAE(codebook_dim=8, base_ch=32, patch_size=12)
    with pytest.raises(ValueError, match="divisible by 32 or 24"):
        InfinityBSQVAE(codebook_dim=8, base_ch=20)


# ---------------------------------------------------------------------------------------------------------------------
# config inference on official checkpoints whose encoder and decoder widths differ (the official ``vae_model`` lets
# ``decoder_ch_mult`` differ from ``encoder_ch_mult``), and the 4-level patch-8 layout of the 8B (d56) VAE
# ---------------------------------------------------------------------------------------------------------------------
def _official_checkpoint(model, codebook_dim):
    """``{'vae': state dict}`` in the official wrapped naming (``X.conv.weight`` / ``X.norm.weight``) plus the masks."""
    out = {}
    for module_name, module in model.named_modules():
        wrap = {"Conv2d": "conv", "GroupNorm": "norm"}.get(type(module).__name__)
        for param_name, param in module.named_parameters(recurse=False):
            out[f"{module_name}.{wrap}.{param_name}"] = param.detach().clone()
    mask = 2 ** torch.arange(codebook_dim - 1, -1, -1)
    out.update({k: mask.clone() for k in MASK_KEYS})
    return {"vae": out}


@pytest.mark.parametrize(
    "config",
    [
        dict(
            codebook_dim=4, base_ch=32, encoder_ch_mult=[1, 1, 1, 1, 1], decoder_ch_mult=[2, 1, 1, 1, 1], patch_size=16
        ),
        dict(codebook_dim=4, base_ch=32, encoder_ch_mult=[1, 2, 2], decoder_ch_mult=[1, 1, 3], patch_size=4),
        dict(
            codebook_dim=6,
            base_ch=24,
            encoder_ch_mult=[1, 2, 2, 2],
            decoder_ch_mult=[2, 2, 1, 1],
            patch_size=8,
            num_res_blocks=1,
        ),
        dict(
            codebook_dim=4, base_ch=32, encoder_ch_mult=[1, 1, 1, 1], decoder_ch_mult=[1, 1, 1, 1], patch_size=8
        ),  # d56-style
    ],
)
def test_inferred_config_reads_each_side_from_its_own_tensors(config, tmp_path):
    torch.manual_seed(0)
    model = InfinityBSQVAE(**config).eval()
    path = tmp_path / "vae.pth"
    torch.save(_official_checkpoint(model, config["codebook_dim"]), path)
    loaded = InfinityBSQVAE.from_original_checkpoint(path)
    for key, value in config.items():
        assert loaded.config[key] == value, (key, loaded.config[key], value)
    expected = model.state_dict()
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in expected.items())
    z = torch.randn(1, config["codebook_dim"], 3, 2)
    assert torch.equal(loaded.decode(z), model.decode(z))
    assert loaded.decode(z).shape[-2:] == (3 * config["patch_size"], 2 * config["patch_size"])


def test_inference_rejects_inconsistent_sides():
    model = InfinityBSQVAE(
        codebook_dim=4, base_ch=32, encoder_ch_mult=[1, 1, 1], decoder_ch_mult=[1, 1, 1], patch_size=4
    )
    sd = _official_checkpoint(model, 4)["vae"]
    bad = {k: v for k, v in sd.items() if not k.startswith("encoder.down.1.downsample")}
    with pytest.raises(ValueError, match="downsamples"):
        infer_infinity_vae_config(bad)
    bad = dict(sd, **{"encoder.conv_in.conv.weight": torch.zeros(48, 3, 3, 3)})
    with pytest.raises(ValueError, match="base_ch=48"):
        infer_infinity_vae_config(bad)
