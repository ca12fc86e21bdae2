"""Tests of HART's residual diffusion head against the golden fixture of the official code (see the fixture's
FIXTURE.md).

Everything is read from the fixture folder (``tests/fixtures/hart``, or ``$VAR_ACCEL_HART_FIXTURE``); a missing folder
fails the tests. The head is built from ``hart-tiny/llm/config.json`` (+ the tokenizer's ``z_channels``) and loaded
with the ``diffloss.*`` slice of ``llm/ema_model.bin`` (the weights every reference output uses).
"""

import json
import os
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from diffusers_var_accel.models.diffusion_head_hart import (
    HARTDiffusionHead,
    hart_diffusion_head_config_from_original,
    space_timesteps,
)

FIXTURE_ENV = "VAR_ACCEL_HART_FIXTURE"
DIFF_ATOL = 2e-3  # FIXTURE.md: diff_out


@pytest.fixture(scope="module")
def fixture_dir():
    path = Path(os.environ.get(FIXTURE_ENV, Path(__file__).resolve().parents[1] / "fixtures" / "hart"))
    if not (path / "manifest.json").is_file():
        pytest.fail(f"HART fixture folder {path} (or its manifest.json) is missing; set {FIXTURE_ENV}")
    return path


@pytest.fixture(scope="module")
def manifest(fixture_dir):
    with open(fixture_dir / "manifest.json") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def llm_config(fixture_dir):
    with open(fixture_dir / "hart-tiny" / "llm" / "config.json") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def token_channels(fixture_dir):
    with open(fixture_dir / "hart-tiny" / "tokenizer" / "config.json") as f:
        return json.load(f)["z_channels"]


@pytest.fixture(scope="module")
def diffloss_state_dict(fixture_dir):
    ema = torch.load(fixture_dir / "hart-tiny" / "llm" / "ema_model.bin", map_location="cpu", weights_only=True)
    return {k[len("diffloss.") :]: v for k, v in ema.items() if k.startswith("diffloss.")}


@pytest.fixture(scope="module")
def head(llm_config, token_channels, diffloss_state_dict):
    head = HARTDiffusionHead(
        token_channels=token_channels,
        condition_channels=llm_config["embed_dim"],
        width=llm_config["diff_width"],
        depth=llm_config["diff_depth"],
        num_sampling_steps=llm_config["num_sampling_steps"],
    )
    head.load_state_dict(diffloss_state_dict, strict=True)
    return head.eval()


@pytest.fixture(scope="module")
def greedy_runs(fixture_dir, manifest):
    """(name, manifest entry, reference tensors) of every run that stores the diffusion inputs."""
    runs = []
    for run, meta in manifest["runs"].items():
        ref = load_file(str(fixture_dir / f"ref_{run}.safetensors"))
        if "diff_cond" in ref and "diff_noise_0" in ref:
            runs.append((run, meta, ref))
    if not runs:
        pytest.fail("no run of the fixture stores diff_cond / diff_noise_* (the greedy runs do)")
    return runs


def _step_noises(ref):
    count = len([k for k in ref if re.fullmatch(r"diff_noise_\d+", k)])
    return [ref[f"diff_noise_{i}"] for i in range(1, count)]


def test_respacing():
    assert space_timesteps(1000, "8") == {0, 143, 285, 428, 571, 714, 856, 999}
    assert space_timesteps(1000, "4") == {0, 333, 666, 999}
    assert space_timesteps(1000, "ddim4") == {0, 250, 500, 750}


def test_head_structure(head, llm_config, diffloss_state_dict):
    assert head.num_steps == len(space_timesteps(1000, llm_config["num_sampling_steps"]))
    assert head.timestep_map == sorted(space_timesteps(1000, llm_config["num_sampling_steps"]))
    assert set(head.state_dict()) == set(diffloss_state_dict)  # no schedule tables in the state dict
    config = hart_diffusion_head_config_from_original(llm_config, head.token_channels)
    assert config["condition_channels"] == llm_config["embed_dim"] and config["width"] == llm_config["diff_width"]
    with pytest.raises(ValueError, match="sampler"):
        hart_diffusion_head_config_from_original({**llm_config, "sampler": "ddim"}, head.token_channels)


def test_sample_matches_reference_with_recorded_noise(head, greedy_runs):
    for run, meta, ref in greedy_runs:
        steps = _step_noises(ref)
        assert len(steps) == head.num_steps, run
        out = head.sample(
            ref["diff_cond"], guidance=meta["diffusion_cfg_t"], initial_noise=ref["diff_noise_0"], step_noises=steps
        )
        n = ref["diff_cond"].shape[0] // 2
        assert out.shape == (n, head.token_channels) and out.dtype == torch.float32
        # The official output has 2N rows (x 0.6 included); the loop keeps the first N, which we return.
        torch.testing.assert_close(out, ref["diff_out"][:n], atol=DIFF_ATOL, rtol=0, msg=lambda m: f"{run}: {m}")


def test_sample_generator_order(head, greedy_runs):
    """Seeding a CPU generator as the official global RNG was seeded reproduces the recorded run: the noise is drawn
    as randn(N, Cv), then one randn(2N, Cv) per step."""
    for run, meta, ref in greedy_runs:
        seed = meta["torch_manual_seed_before_call"]
        g = torch.Generator().manual_seed(seed)
        assert torch.equal(torch.randn(ref["diff_noise_0"].shape, generator=g), ref["diff_noise_0"]), run
        for i, noise in enumerate(_step_noises(ref), start=1):
            assert torch.equal(torch.randn(noise.shape, generator=g), noise), (run, i)
        out = head.sample(
            ref["diff_cond"], guidance=meta["diffusion_cfg_t"], generator=torch.Generator().manual_seed(seed)
        )
        n = ref["diff_cond"].shape[0] // 2
        torch.testing.assert_close(out, ref["diff_out"][:n], atol=DIFF_ATOL, rtol=0, msg=lambda m: f"{run}: {m}")


def test_sample_argument_checks_and_modes(head, greedy_runs):
    _, meta, ref = greedy_runs[0]
    cond = ref["diff_cond"][:64]  # 32 cond rows + 32 (here arbitrary) uncond rows
    with pytest.raises(TypeError, match="guidance"):
        head.sample(cond, guidance=torch.tensor(2.0))
    with pytest.raises(ValueError, match="step_noises"):
        head.sample(cond, guidance=2.0, initial_noise=torch.zeros(32, head.token_channels), step_noises=[])
    with pytest.raises(ValueError, match="condition"):
        head.sample(cond[:63], guidance=2.0)
    # Temperature 0 removes the per-step noise, so the result depends on the initial noise only.
    a = head.sample(cond, 2.0, generator=torch.Generator().manual_seed(1), temperature=0.0)
    g = torch.Generator().manual_seed(1)
    initial = torch.randn(32, head.token_channels, generator=g)
    b = head.sample(
        cond,
        2.0,
        initial_noise=initial,
        step_noises=[torch.full((64, head.token_channels), 7.0)] * head.num_steps,
        temperature=0.0,
    )
    assert torch.equal(a, b)
    # guidance == 1.0 takes the official no-CFG branch: a (2N, Cv) initial draw, unguided cond rows.
    g1 = torch.Generator().manual_seed(3)
    out1 = head.sample(cond, 1.0, generator=g1)
    g2 = torch.Generator().manual_seed(3)
    initial = torch.randn(64, head.token_channels, generator=g2)
    steps = [torch.randn(64, head.token_channels, generator=g2) for _ in range(head.num_steps)]
    out2 = head.sample(cond, 1.0, initial_noise=initial, step_noises=steps)
    assert torch.equal(out1, out2)
    # ... which, without guidance, equals guidance 0 run from the same first-half noise.
    out0 = head.sample(cond, 0.0, initial_noise=initial[:32], step_noises=steps)
    torch.testing.assert_close(out0, out1, atol=1e-6, rtol=0)
