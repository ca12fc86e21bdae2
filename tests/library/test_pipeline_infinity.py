"""InfinityPipeline behaviour on tiny random-weight components of the real architectures (CPU, offline).

The weights are random (``pipelines/<family>/tiny.py``), so these tests check the mechanics: outputs and their
types, determinism, batching, guidance, the text-encoder bypass, callbacks, input errors, strict checkpoint loading and
that the modules keep no per-call state. Numerical faithfulness to the official code is ``test_parity_infinity.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import PIL.Image
import pytest
import torch

from diffusers_var_accel import InfinityPipeline, InfinityTransformer, schedule_for_size, supported_sizes
from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline, build_tiny_t5
from diffusers_var_accel.utils.tiny import TINY_VOCABULARY

REPO = Path(__file__).resolve().parents[2]
FIXTURE_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "infinity"
SIZE = dict(height=256, width=256)
PROMPT = "a red fox in the snow"
PROMPTS = ["a red fox in the snow", "two cats"]  # different token counts: the batch is padded


def gen(seed: int) -> torch.Generator:
    return torch.Generator("cpu").manual_seed(seed)


@pytest.fixture(scope="module")
def pipe():
    pipeline = build_tiny_infinity_pipeline(seed=0)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


@pytest.fixture(scope="module")
def pipe_no_text():
    pipeline = build_tiny_infinity_pipeline(seed=0, with_text_encoder=False)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


@pytest.fixture(scope="module")
def saved_dir(pipe, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_infinity")
    pipe.save_pretrained(folder)
    return folder


def latents(pipe, prompt=PROMPT, seed=0, **kwargs):
    return pipe(
        prompt, generator=kwargs.pop("generator", gen(seed)), output_type="latent", **{**SIZE, **kwargs}
    ).images


# ---------------------------------------------------------------------------------------------------------------------
# the builders
# ---------------------------------------------------------------------------------------------------------------------
def test_tiny_builders_are_seeded_and_leave_the_global_rng_alone(pipe):
    state = torch.random.get_rng_state()
    again = build_tiny_infinity_pipeline(seed=0)
    other = build_tiny_infinity_pipeline(seed=1)
    assert torch.equal(torch.random.get_rng_state(), state)
    for name in ("transformer", "vae", "text_encoder"):
        ours, same, diff = (getattr(p, name).state_dict() for p in (pipe, again, other))
        assert all(torch.equal(ours[k], same[k]) for k in ours), name
        assert not all(torch.equal(ours[k], diff[k]) for k in ours if ours[k].is_floating_point()), name
    t = pipe.transformer
    # the parameters that default to zero (or a constant) are non-zero and varied, norm gains stay near 1
    for block in t.blocks:
        assert block.ada_gss.abs().min() > 0 and block.sa.scale_mul_1H11.std() > 0
    assert t.cfg_uncond.abs().min() > 0 and t.pos_start.abs().min() > 0
    assert (t.text_norm.weight - 1).abs().max() < 0.5 and (t.blocks[0].ca_norm.weight - 1).abs().max() < 0.5


def test_tiny_tokenizer_round_trip_and_unknown_words(tmp_path):
    from transformers import AutoTokenizer, T5EncoderModel

    text_encoder, tokenizer = build_tiny_t5(text_channels=32, seed=0)
    assert tokenizer.pad_token_id == 0 and tokenizer.convert_ids_to_tokens(tokenizer.eos_token_id) == "</s>"
    ids = tokenizer("A Red FOX").input_ids
    assert ids[-1] == tokenizer.eos_token_id and len(ids) == 4 and tokenizer.unk_token_id not in ids
    assert tokenizer("a zyzzyva").input_ids[1] == tokenizer.unk_token_id  # out-of-vocabulary word
    assert "zyzzyva" not in TINY_VOCABULARY
    text_encoder.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    tokenizer2 = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    encoder2 = T5EncoderModel.from_pretrained(tmp_path, local_files_only=True)
    batch = tokenizer2(["a red fox", "two cats sleeping on a bed"], padding="longest", return_tensors="pt")
    assert (
        batch.input_ids.tolist()
        == tokenizer(
            ["a red fox", "two cats sleeping on a bed"], padding="longest", return_tensors="pt"
        ).input_ids.tolist()
    )
    assert batch.attention_mask.sum(1).tolist() == [4, 7] and tokenizer2.model_max_length == tokenizer.model_max_length
    with torch.no_grad():
        a = text_encoder(**batch).last_hidden_state
        b = encoder2(**batch).last_hidden_state
    assert torch.equal(a, b) and a.shape == (2, 7, 32)


# ---------------------------------------------------------------------------------------------------------------------
# outputs
# ---------------------------------------------------------------------------------------------------------------------
def test_output_types(pipe):
    d = pipe.transformer.config.codebook_dim
    pil = pipe(PROMPT, generator=gen(0), **SIZE).images
    assert len(pil) == 1 and isinstance(pil[0], PIL.Image.Image) and pil[0].size == (256, 256)
    np_images = pipe(PROMPT, generator=gen(0), output_type="np", **SIZE).images
    assert isinstance(np_images, np.ndarray) and np_images.shape == (1, 256, 256, 3) and np_images.dtype == np.float32
    assert np_images.min() >= 0 and np_images.max() <= 1 and np_images.std() > 0.01
    pt = pipe(PROMPT, generator=gen(0), output_type="pt", **SIZE).images
    assert isinstance(pt, torch.Tensor) and pt.shape == (1, 3, 256, 256) and pt.min() >= 0 and pt.max() <= 1
    np.testing.assert_allclose(pt.permute(0, 2, 3, 1).numpy(), np_images, atol=1e-6)
    assert np.array_equal(np.asarray(pil[0]), (np_images[0] * 255).round().astype(np.uint8))
    lat = latents(pipe)
    assert lat.shape == (1, d, 16, 16)
    as_tuple = pipe(PROMPT, generator=gen(0), output_type="pt", return_dict=False, **SIZE)
    assert isinstance(as_tuple, tuple) and len(as_tuple) == 1 and torch.equal(as_tuple[0], pt)


def test_determinism(pipe):
    a = pipe(PROMPT, generator=gen(0), output_type="pt", **SIZE).images
    b = pipe(PROMPT, generator=gen(0), output_type="pt", **SIZE).images
    c = pipe(PROMPT, generator=gen(1), output_type="pt", **SIZE).images
    assert torch.equal(a, b)
    assert not torch.equal(a, c) and (a - c).abs().mean() > 1e-3
    assert not torch.equal(latents(pipe, "a blue dog"), latents(pipe))  # the prompt matters


def test_save_and_load_round_trip_is_bit_identical(pipe, saved_dir):
    for name in ("model_index.json", "transformer", "vae", "text_encoder", "tokenizer"):
        assert (saved_dir / name).exists(), name
    index = json.loads((saved_dir / "model_index.json").read_text())
    assert index["_class_name"] == "InfinityPipeline"
    assert index["transformer"] == ["diffusers_var_accel.models.transformer_infinity", "InfinityTransformer"]
    assert index["vae"] == ["diffusers_var_accel.models.autoencoder_bsq", "InfinityBSQVAE"]
    loaded = InfinityPipeline.from_pretrained(saved_dir)
    loaded.set_progress_bar_config(disable=True)
    for seed in (0, 3):
        assert torch.equal(
            pipe(PROMPT, generator=gen(seed), output_type="pt", **SIZE).images,
            loaded(PROMPT, generator=gen(seed), output_type="pt", **SIZE).images,
        )
        assert torch.equal(latents(pipe, seed=seed), latents(loaded, seed=seed))


def test_import_of_the_package_suffices_for_from_pretrained(saved_dir):
    """In a fresh interpreter, ``import diffusers_var_accel`` alone lets from_pretrained resolve our classes."""
    code = (
        "import sys, diffusers_var_accel\n"
        "assert 'diffusers_var_accel.pipelines.infinity.tiny' not in sys.modules\n"
        f"p = diffusers_var_accel.InfinityPipeline.from_pretrained({str(saved_dir)!r})\n"
        "print(type(p.transformer).__name__, type(p.vae).__name__, type(p.text_encoder).__name__)\n"
    )
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-3:] == ["InfinityTransformer", "InfinityBSQVAE", "T5EncoderModel"]


# ---------------------------------------------------------------------------------------------------------------------
# batching
# ---------------------------------------------------------------------------------------------------------------------
def test_batch_equals_single_runs_greedy(pipe):
    batch = latents(pipe, PROMPTS, top_k=1)
    assert batch.shape[0] == 2
    for i, prompt in enumerate(PROMPTS):
        assert torch.equal(batch[i], latents(pipe, prompt, top_k=1)[0]), prompt


def test_batch_equals_single_runs_sampled_with_one_generator_per_image(pipe):
    seeds = [11, 22]
    batch = latents(pipe, PROMPTS, generator=[gen(s) for s in seeds])
    for i, (prompt, seed) in enumerate(zip(PROMPTS, seeds)):
        assert torch.equal(batch[i], latents(pipe, prompt, generator=[gen(seed)])[0]), prompt
    assert not torch.equal(batch[0], latents(pipe, PROMPTS[0], seed=seeds[1])[0])


def test_num_images_per_prompt(pipe):
    images = pipe(PROMPTS, num_images_per_prompt=2, generator=gen(0), output_type="pt", **SIZE).images
    assert images.shape == (4, 3, 256, 256)
    assert not torch.equal(images[0], images[1])  # same prompt, different samples
    pil = pipe(PROMPT, num_images_per_prompt=2, generator=gen(0), **SIZE).images
    assert len(pil) == 2 and all(im.size == (256, 256) for im in pil)
    # with one generator per image, images of one prompt are its single runs
    per_image = latents(pipe, PROMPT, num_images_per_prompt=2, generator=[gen(5), gen(6)])
    assert torch.equal(per_image[1], latents(pipe, PROMPT, generator=[gen(6)])[0])


# ---------------------------------------------------------------------------------------------------------------------
# guidance
# ---------------------------------------------------------------------------------------------------------------------
def _logit_rows(pipe, **kwargs):
    rows = []

    def record(p, scale_index, scale, callback_kwargs):
        rows.append(callback_kwargs["logits"].shape[0])
        return {}

    out = latents(
        pipe, PROMPTS, top_k=1, callback_on_step_end=record, callback_on_step_end_tensor_inputs=["logits"], **kwargs
    )
    return out, rows


def test_guidance_scale_one_runs_without_the_unconditional_rows(pipe):
    guided, guided_rows = _logit_rows(pipe, guidance_scale=4.0)
    plain, plain_rows = _logit_rows(pipe, guidance_scale=1.0)
    num_scales = len(schedule_for_size(**SIZE)[0])
    assert guided_rows == [4] * num_scales and plain_rows == [2] * num_scales
    assert not torch.equal(guided, plain)
    # cfg_list of all ones is the same as guidance_scale=1
    ones, ones_rows = _logit_rows(pipe, cfg_list=[1.0] * num_scales)
    assert ones_rows == plain_rows and torch.equal(ones, plain)


def test_negative_prompt_changes_the_image(pipe):
    none = latents(pipe, top_k=1)
    negative = latents(pipe, top_k=1, negative_prompt="a blurry dark photo")
    assert not torch.equal(none, negative)
    # a negative prompt has no effect without guidance
    assert torch.equal(
        latents(pipe, top_k=1, guidance_scale=1.0),
        latents(pipe, top_k=1, guidance_scale=1.0, negative_prompt="a blurry dark photo"),
    )
    # the negative prompt's embeddings given directly are the same as the text
    neg_embeds, neg_mask = pipe.encode_prompt("a blurry dark photo")
    assert torch.equal(
        negative, latents(pipe, top_k=1, negative_prompt_embeds=neg_embeds, negative_prompt_attention_mask=neg_mask)
    )


# ---------------------------------------------------------------------------------------------------------------------
# text-encoder bypass
# ---------------------------------------------------------------------------------------------------------------------
def test_prompt_embeds_bypass(pipe, pipe_no_text):
    embeds, mask = pipe.encode_prompt(PROMPTS)
    assert embeds.shape[:2] == mask.shape and embeds.shape[-1] == pipe.transformer.config.text_channels
    assert mask.sum(1).tolist() == [7, 3]  # 6 and 2 words + </s>; the second prompt is padded
    from_text = latents(pipe, PROMPTS, seed=4)
    from_embeds = pipe(
        prompt_embeds=embeds, prompt_attention_mask=mask, generator=gen(4), output_type="latent", **SIZE
    ).images
    assert torch.equal(from_text, from_embeds)
    # the same seed builds the same transformer and VAE without a text encoder
    without = pipe_no_text(
        prompt_embeds=embeds, prompt_attention_mask=mask, generator=gen(4), output_type="latent", **SIZE
    ).images
    assert torch.equal(from_text, without)
    assert pipe_no_text(prompt_embeds=embeds, prompt_attention_mask=mask, generator=gen(4), **SIZE).images[0].size == (
        256,
        256,
    )
    with pytest.raises(ValueError, match="prompt_embeds"):
        pipe_no_text(PROMPT, generator=gen(0), **SIZE)
    with pytest.raises(ValueError, match="prompt_embeds"):
        pipe_no_text(prompt_embeds=embeds, prompt_attention_mask=mask, negative_prompt="blurry", **SIZE)


# ---------------------------------------------------------------------------------------------------------------------
# callbacks and progress bar
# ---------------------------------------------------------------------------------------------------------------------
def test_callback_on_step_end(pipe):
    schedule, _ = schedule_for_size(**SIZE)
    calls = []

    def record(p, scale_index, scale, callback_kwargs):
        assert p is pipe
        calls.append((scale_index, tuple(scale), sorted(callback_kwargs)))
        return {}

    baseline = latents(pipe, top_k=1, callback_on_step_end=record)
    assert calls == [(i, tuple(s), ["latents"]) for i, s in enumerate(schedule)]
    assert torch.equal(baseline, latents(pipe, top_k=1))  # a callback that returns nothing changes nothing

    def zero_latents_at_scale_2(p, scale_index, scale, callback_kwargs):
        return {"latents": torch.zeros_like(callback_kwargs["latents"])} if scale_index == 2 else {}

    changed = latents(pipe, top_k=1, callback_on_step_end=zero_latents_at_scale_2)
    assert changed.shape == baseline.shape and not torch.equal(changed, baseline)

    def zero_at_the_end(p, scale_index, scale, callback_kwargs):
        return {"latents": torch.zeros_like(callback_kwargs["latents"])} if scale_index == len(schedule) - 1 else {}

    assert torch.equal(latents(pipe, top_k=1, callback_on_step_end=zero_at_the_end), torch.zeros_like(baseline))

    with pytest.raises(ValueError, match="not_a_tensor") as info:
        latents(pipe, callback_on_step_end=record, callback_on_step_end_tensor_inputs=["latents", "not_a_tensor"])
    assert "latents" in str(info.value)  # the allowed names are listed


def test_progress_bar_can_be_disabled(capsys):
    pipeline = build_tiny_infinity_pipeline(seed=0, with_text_encoder=False)
    embeds = torch.randn(1, 5, pipeline.transformer.config.text_channels, generator=gen(0))
    num_scales = len(schedule_for_size(**SIZE)[0])
    pipeline.set_progress_bar_config(disable=False)
    pipeline(prompt_embeds=embeds, output_type="latent", generator=gen(0), **SIZE)
    assert f"{num_scales}/{num_scales}" in capsys.readouterr().err
    pipeline.set_progress_bar_config(disable=True)
    pipeline(prompt_embeds=embeds, output_type="latent", generator=gen(0), **SIZE)
    assert f"{num_scales}/{num_scales}" not in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------------------
# input errors
# ---------------------------------------------------------------------------------------------------------------------
def test_unsupported_size_lists_the_supported_sizes(pipe):
    with pytest.raises(ValueError) as info:
        pipe(PROMPT, height=300, width=300)
    message = str(info.value)
    assert "300x300" in message and "1024x1024" in message and "256x256" in message


@pytest.mark.parametrize("name", ["cfg_list", "tau_list"])
@pytest.mark.parametrize("length", [3, 8])
def test_per_scale_lists_of_the_wrong_length(pipe, name, length):
    num_scales = len(schedule_for_size(**SIZE)[0])
    with pytest.raises(ValueError, match=name) as info:
        pipe(PROMPT, **{name: [1.5] * length}, **SIZE)
    assert f"{length} values" in str(info.value) and f"{num_scales} scales" in str(info.value)


@pytest.mark.parametrize("top_p", [0, 0.0, -0.1, 1.5])
def test_top_p_outside_the_unit_interval(pipe, top_p):
    with pytest.raises(ValueError, match="top_p") as info:
        pipe(PROMPT, top_p=top_p, **SIZE)
    assert str(top_p) in str(info.value) and "(0, 1]" in str(info.value)


def test_top_p_one_and_none_are_accepted(pipe):
    one = latents(pipe, top_p=1.0, seed=2)
    off = latents(pipe, top_p=None, seed=2)
    assert one.shape == off.shape and torch.equal(one, off)  # keeping all the mass is no filtering
    assert not torch.equal(latents(pipe, top_p=0.6, seed=2), off)  # a real threshold changes the samples


def test_negative_top_k(pipe):
    with pytest.raises(ValueError, match="top_k") as info:
        pipe(PROMPT, top_k=-1, **SIZE)
    assert "-1" in str(info.value)


def test_wrong_number_of_generators(pipe):
    with pytest.raises(ValueError, match="generators") as info:
        pipe(PROMPTS, generator=[gen(0)], **SIZE)
    assert "1" in str(info.value) and "2" in str(info.value)
    with pytest.raises(ValueError, match="generators"):
        pipe(PROMPT, num_images_per_prompt=2, generator=[gen(0), gen(1), gen(2)], **SIZE)


def test_prompt_and_prompt_embeds_exclusive(pipe):
    with pytest.raises(ValueError, match="prompt_embeds"):
        pipe(**SIZE)
    embeds, mask = pipe.encode_prompt(PROMPT)
    with pytest.raises(ValueError, match="prompt_embeds"):
        pipe(PROMPT, prompt_embeds=embeds, prompt_attention_mask=mask, **SIZE)


# ---------------------------------------------------------------------------------------------------------------------
# strict checkpoint loading
# ---------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def official_state_dict():
    path = FIXTURE_DIR / "infinity_tiny.pth"
    if not path.is_file():
        pytest.fail(f"fixture checkpoint missing: {path}")
    return torch.load(path, map_location="cpu", weights_only=True)


def test_checkpoint_with_a_missing_key(official_state_dict):
    state_dict = dict(official_state_dict)
    del state_dict["head.bias"]
    with pytest.raises(ValueError, match="head.bias") as info:
        InfinityTransformer.from_original_checkpoint(state_dict)
    assert "missing" in str(info.value).lower()


def test_checkpoint_with_an_extra_key(official_state_dict):
    state_dict = {**official_state_dict, "extra_module.weight": torch.zeros(2, 2)}
    with pytest.raises(ValueError, match="extra_module.weight") as info:
        InfinityTransformer.from_original_checkpoint(state_dict)
    assert "unexpected" in str(info.value).lower()


def test_checkpoint_with_a_wrong_shape(official_state_dict):
    state_dict = dict(official_state_dict)
    good = state_dict["head_nm.ada_lin.1.bias"]
    state_dict["head_nm.ada_lin.1.bias"] = torch.zeros(good.shape[0] + 1)
    with pytest.raises(ValueError, match=r"head_nm\.ada_lin\.1\.bias") as info:
        InfinityTransformer.from_original_checkpoint(state_dict)
    assert str(good.shape[0] + 1) in str(info.value)


def test_checkpoint_errors_list_every_bad_key(official_state_dict):
    state_dict = {**official_state_dict, "extra_a": torch.zeros(1), "extra_b": torch.zeros(1)}
    del state_dict["head.bias"], state_dict["word_embed.bias"]
    with pytest.raises(ValueError) as info:
        InfinityTransformer.from_original_checkpoint(state_dict)
    for key in ("extra_a", "extra_b", "head.bias", "word_embed.bias"):
        assert key in str(info.value)


def test_safetensors_copy_loads_the_same_weights(official_state_dict):
    from_pth = InfinityTransformer.from_original_checkpoint(FIXTURE_DIR / "infinity_tiny.pth").state_dict()
    from_st = InfinityTransformer.from_original_checkpoint(FIXTURE_DIR / "infinity_tiny.safetensors").state_dict()
    assert set(from_pth) == set(from_st)
    assert all(torch.equal(from_pth[k], from_st[k]) for k in from_pth)
    assert torch.equal(from_pth["pos_start"], official_state_dict["pos_start"])


# ---------------------------------------------------------------------------------------------------------------------
# other aspect ratios
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("template", [0.5, 2.0])
def test_other_aspect_ratio(pipe, template):
    ((height, width),) = [hw for hw, (t, budget) in supported_sizes().items() if t == template and budget == "0.06M"]
    assert height != width
    image = pipe(PROMPT, height=height, width=width, generator=gen(0)).images[0]
    assert image.size == (width, height)
    lat = pipe(PROMPT, height=height, width=width, generator=gen(0), output_type="latent").images
    assert lat.shape[-2:] == (height // 16, width // 16)


# ---------------------------------------------------------------------------------------------------------------------
# no per-call state on the modules
# ---------------------------------------------------------------------------------------------------------------------
def _tensors_held(obj, path, depth=0):
    """Paths of tensors held by ``obj``'s plain attributes (parameters, buffers and submodules excluded)."""
    found = []
    if depth > 3:
        return found
    if isinstance(obj, torch.Tensor):
        return [path]
    if isinstance(obj, torch.nn.Module):
        items = [(k, v) for k, v in vars(obj).items() if k not in ("_parameters", "_buffers", "_modules")]
    elif isinstance(obj, dict):
        items = list(obj.items())
    elif isinstance(obj, (list, tuple, set)):
        items = list(enumerate(obj))
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        items = list(vars(obj).items())
    else:
        return found
    for key, value in items:
        if isinstance(value, torch.nn.Module):
            continue  # submodules are visited by modules()
        found += _tensors_held(value, f"{path}.{key}", depth + 1)
    return found


def test_no_tensor_state_on_the_modules_after_a_call(pipe):
    first = pipe(PROMPTS, generator=gen(0), output_type="pt", **SIZE).images
    held = []
    for component in ("transformer", "vae"):
        for name, module in getattr(pipe, component).named_modules():
            held += _tensors_held(module, f"{component}.{name}" if name else component)
    assert held == []
    second = pipe(PROMPTS, generator=gen(0), output_type="pt", **SIZE).images
    assert torch.equal(first, second)


def test_state_check_would_catch_a_leftover_tensor(pipe):
    """The check above is not vacuous: a tensor left on a submodule (or its processor) is found."""
    block = pipe.transformer.blocks[0]
    block.sa.processor.leftover_cache = [torch.zeros(1)]
    try:
        assert _tensors_held(block.sa, "sa") == ["sa.processor.leftover_cache.0"]
    finally:
        del block.sa.processor.leftover_cache
    assert _tensors_held(block.sa, "sa") == []


def test_fixed_schedule_model_makes_its_one_size(tmp_path):
    """A transformer trained for one schedule (the embedded model's kind) fixes the size and RoPE grid."""
    from diffusers_var_accel import InfinityBSQVAE

    schedule = [(1, p, p) for p in (1, 2, 3, 4, 6, 8)]
    transformer = InfinityTransformer(
        depth=1,
        embed_dim=32,
        num_heads=2,
        text_channels=16,
        text_maxlen=8,
        codebook_dim=8,
        block_chunks=1,
        scale_schedule=schedule,
    )
    vae = InfinityBSQVAE(
        codebook_dim=8,
        base_ch=32,
        encoder_ch_mult=(1, 1, 2),
        decoder_ch_mult=(1, 1, 2),
        num_res_blocks=1,
        patch_size=4,
    )
    pipe = InfinityPipeline(transformer=transformer, vae=vae, text_encoder=None, tokenizer=None)
    pipe.set_progress_bar_config(disable=True)
    assert pipe.default_size == (32, 32)
    embeds = torch.randn(1, 3, 16, generator=gen(0))
    out = pipe(prompt_embeds=embeds, generator=gen(0), output_type="pt").images
    assert out.shape == (1, 3, 32, 32)
    with pytest.raises(ValueError, match="32x32 images only"):
        pipe(prompt_embeds=embeds, height=256, width=256)
    pipe.save_pretrained(tmp_path)
    loaded = InfinityPipeline.from_pretrained(tmp_path)
    loaded.set_progress_bar_config(disable=True)
    assert loaded.transformer.config.scale_schedule == [list(s) for s in schedule]
    assert torch.equal(loaded(prompt_embeds=embeds, generator=gen(0), output_type="pt").images, out)
    with pytest.raises(ValueError, match="scale_schedule"):
        InfinityTransformer(
            depth=1,
            embed_dim=32,
            num_heads=2,
            text_channels=16,
            text_maxlen=8,
            codebook_dim=8,
            scale_schedule=[(2, 1)],
        )
