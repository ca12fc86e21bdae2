"""Bad call arguments of both pipelines: every one is an error of a clear type whose message names the bad value.

Sizes, guidance and sampling values, prompts and embeddings, generators, output types and teacher tokens, several
values of each kind, on the embedded Infinity model and a tiny HART (the checks run before any transformer pass, so
each case costs milliseconds). Also: an over-long prompt warns with its length, and with a list of generators a
batch reproduces each image's single call exactly (also after decoding to 8-bit images).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from diffusers_var_accel.embedded import EMBEDDED_SAMPLING
from diffusers_var_accel.pipelines.pipeline_loading import load_embedded_pipeline
from diffusers_var_accel.pipelines.input_checks import InputTypeError
from diffusers_var_accel.pipelines.hart.tiny import build_tiny_hart_pipeline

PROMPT = "a red circle"
NAN, INF = float("nan"), float("inf")


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    yield


@pytest.fixture(scope="module")
def infinity():
    pipe = load_embedded_pipeline()
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def hart():
    pipe = build_tiny_hart_pipeline(seed=0)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(params=["infinity", "hart"])
def pipe(request):
    return request.getfixturevalue(request.param)


def num_scales(pipe) -> int:
    if hasattr(pipe.transformer.config, "patch_nums"):
        return len(pipe.transformer.config.patch_nums)
    return len(pipe.transformer.config.scale_schedule)


def size_of(pipe):
    size = pipe.default_size
    return size if isinstance(size, tuple) else (size, size)


def text_width(pipe) -> int:
    config = pipe.transformer.config
    return config.text_channels if hasattr(config, "text_channels") else config.context_dim


def text_tokens(pipe) -> int:
    return getattr(pipe.transformer.config, "context_tokens", 5)


def assert_error(pipe, kwargs, error, *needles):
    with pytest.raises(error) as info:
        pipe(**{"prompt": PROMPT, "generator": gen(0), **kwargs})
    message = str(info.value)
    for needle in needles:
        assert needle in message, (needle, message)
    return message


# ---------------------------------------------------------------------------------------------------------------------
# sizes
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("side", ["height", "width"])
@pytest.mark.parametrize(
    "value, error",
    [(0, ValueError), (-64, ValueError), ("64", TypeError), (64.0, TypeError), (True, TypeError), ([64], TypeError)],
)
def test_bad_height_or_width(pipe, side, value, error):
    h, w = size_of(pipe)
    kwargs = {"height": h, "width": w, side: value}
    assert_error(pipe, kwargs, error, side, repr(value))


@pytest.mark.parametrize("side", ["height", "width"])
def test_one_side_without_the_other(pipe, side):
    h, w = size_of(pipe)
    other = "width" if side == "height" else "height"
    value = h if side == "height" else w
    message = assert_error(pipe, {side: value}, ValueError, f"{side}={value}", f"without {other}")
    assert f"{h}x{w}" in message  # the default size is named


# ---------------------------------------------------------------------------------------------------------------------
# guidance and sampling values
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "value, error",
    [
        (-1.0, ValueError),
        (-0.01, ValueError),
        (NAN, ValueError),
        (INF, ValueError),
        (-INF, ValueError),
        ("4", TypeError),
        (None, TypeError),
    ],
)
def test_bad_guidance_scale(pipe, value, error):
    assert_error(pipe, {"guidance_scale": value}, error, "guidance_scale", repr(value))


@pytest.mark.parametrize("bad", [NAN, INF, -2.0])
@pytest.mark.parametrize("position", [0, -1])
def test_bad_value_in_cfg_list(pipe, bad, position):
    values = [1.5] * num_scales(pipe)
    values[position] = bad
    index = position % len(values)
    assert_error(pipe, {"cfg_list": values}, ValueError, f"cfg_list[{index}]", repr(bad))


@pytest.mark.parametrize("value", ["1.5", 3.0, None])
def test_cfg_list_that_is_not_a_list(pipe, value):
    assert_error(pipe, {"cfg_list": value} if value is not None else {"cfg_list": object()}, TypeError, "cfg_list")


@pytest.mark.parametrize(
    "value, error", [(INF, ValueError), (NAN, ValueError), (0.0, ValueError), (-0.5, ValueError), ("0.5", TypeError)]
)
def test_bad_tau(infinity, value, error):
    assert_error(infinity, {"tau": value}, error, "tau", repr(value))


@pytest.mark.parametrize("bad", [INF, NAN, 0.0])
def test_bad_value_in_tau_list(infinity, bad):
    values = [1.0] * num_scales(infinity)
    values[2] = bad
    assert_error(infinity, {"tau_list": values}, ValueError, "tau_list[2]", repr(bad))


@pytest.mark.parametrize(
    "name, value, error",
    [
        ("top_p", NAN, ValueError),
        ("top_p", "0.9", TypeError),
        ("top_k", NAN, ValueError),
        ("top_k", "5", TypeError),
        ("top_k", INF, ValueError),
    ],
)
def test_bad_top_k_or_top_p(pipe, name, value, error):
    assert_error(pipe, {name: value}, error, name, repr(value))


# ---------------------------------------------------------------------------------------------------------------------
# prompts and embeddings
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "value, error, needle",
    [
        ([], ValueError, "empty list"),
        (["a red circle", None], TypeError, "prompt[1] is None"),
        ([None], TypeError, "prompt[0] is None"),
        (["a red circle", 3], TypeError, "prompt[1] is 3"),
        (5, TypeError, "5"),
        (b"a red circle", TypeError, "bytes"),
    ],
)
def test_bad_prompt(pipe, value, error, needle):
    assert_error(pipe, {"prompt": value}, error, "prompt", needle)


@pytest.mark.parametrize("value, needle", [([None], "negative_prompt[0] is None"), ([], "empty list"), (7, "7")])
def test_bad_negative_prompt(pipe, value, needle):
    with pytest.raises(ValueError) as info:
        pipe(PROMPT, negative_prompt=value, generator=gen(0))
    assert "negative_prompt" in str(info.value) and needle in str(info.value)


@pytest.mark.parametrize(
    "value, error", [(0, ValueError), (-1, ValueError), (2.5, TypeError), ("2", TypeError), (True, TypeError)]
)
def test_bad_num_images_per_prompt(pipe, value, error):
    assert_error(pipe, {"num_images_per_prompt": value}, error, "num_images_per_prompt", repr(value))


def _embeds(pipe, kind):
    T, D = text_tokens(pipe), text_width(pipe)
    return {
        "int": torch.zeros(1, T, D, dtype=torch.int64),
        "bool": torch.zeros(1, T, D, dtype=torch.bool),
        "nan": torch.zeros(1, T, D).index_fill_(2, torch.tensor([1]), NAN),
        "inf": torch.full((1, T, D), INF),
        "width": torch.zeros(1, T, D + 3),
        "2d": torch.zeros(T, D),
        "empty": torch.zeros(0, T, D),
        "list": [[0.0] * D] * T,
    }[kind]


@pytest.mark.parametrize("name", ["prompt_embeds", "negative_prompt_embeds"])
@pytest.mark.parametrize(
    "kind, error, needle",
    [
        ("int", TypeError, "torch.int64"),
        ("bool", TypeError, "torch.bool"),
        ("nan", ValueError, "non-finite"),
        ("inf", ValueError, "non-finite"),
        ("width", ValueError, "shape"),
        ("2d", ValueError, "shape"),
        ("empty", ValueError, "shape"),
        ("list", TypeError, "list"),
    ],
)
def test_bad_text_embeddings(pipe, name, kind, error, needle):
    bad = _embeds(pipe, kind)
    good = torch.zeros(1, text_tokens(pipe), text_width(pipe))
    kwargs = {"prompt": None, "prompt_embeds": good, name: bad}
    message = assert_error(pipe, kwargs, error, name, needle)
    if kind in ("width", "2d", "empty"):
        assert str(tuple(bad.shape)) in message and f"{text_width(pipe)})" in message  # got and allowed


@pytest.mark.parametrize("value", [0, -1, 7])
def test_max_sequence_length_below_one_or_not_an_integer(infinity, value):
    if value == 7:
        with pytest.raises(TypeError, match="max_sequence_length") as info:
            infinity(PROMPT, max_sequence_length=7.5, generator=gen(0))
        assert "7.5" in str(info.value)
        return
    with pytest.raises(ValueError, match="max_sequence_length") as info:
        infinity(PROMPT, max_sequence_length=value, generator=gen(0))
    assert repr(value) in str(info.value)


def test_max_sequence_length_is_honoured(infinity):
    with pytest.warns(UserWarning, match="max_sequence_length"):
        embeds, mask = infinity.encode_prompt("two red circles and a blue square", max_sequence_length=3)
    assert embeds.shape[1] == 3 and mask.shape == (1, 3)


@pytest.mark.parametrize("words", [40, 300])
def test_an_over_long_prompt_warns_with_its_length(pipe, words):
    prompt = " ".join(["red"] * words)
    length = len(pipe.tokenizer(prompt).input_ids)
    with pytest.warns(UserWarning, match="truncated") as record:
        pipe.encode_prompt(prompt)
    assert any(f"{length} tokens" in str(w.message) for w in record)


def test_a_short_prompt_does_not_warn(pipe, recwarn):
    pipe.encode_prompt(PROMPT)
    assert not [w for w in recwarn if "truncated" in str(w.message)]


# ---------------------------------------------------------------------------------------------------------------------
# generators and output types
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "value, needle", [(0, "0"), (42, "42"), ("seed", "'seed'"), ([], "[]"), (np.random.default_rng(0), "Generator")]
)
def test_generator_that_is_not_a_torch_generator(pipe, value, needle):
    assert_error(pipe, {"generator": value}, TypeError, "generator", needle, "torch.Generator")


def test_list_with_a_non_generator(pipe):
    assert_error(pipe, {"prompt": [PROMPT, PROMPT], "generator": [gen(0), 1]}, TypeError, "generator[1]", "1")


@pytest.mark.parametrize("value", [0, "seed"])
def test_hart_diffusion_generator_that_is_not_a_torch_generator(hart, value):
    assert_error(hart, {"diffusion_generator": value}, TypeError, "diffusion_generator", repr(value))


@pytest.mark.parametrize("value", ["foo", "PIL", "numpy", "tensor", None, 1])
def test_unknown_output_type(pipe, value):
    message = assert_error(pipe, {"output_type": value}, ValueError, "output_type", repr(value))
    assert "'pil'" in message and "'latent'" in message  # the allowed values are listed


def test_input_type_errors_are_also_value_errors():
    """So a caller (the CLI) can catch every bad argument as a ValueError."""
    assert issubclass(InputTypeError, TypeError) and issubclass(InputTypeError, ValueError)


# ---------------------------------------------------------------------------------------------------------------------
# teacher tokens
# ---------------------------------------------------------------------------------------------------------------------
def test_infinity_teacher_tokens_of_the_wrong_shape(infinity):
    schedule = infinity.transformer.config.scale_schedule
    d = infinity.vae.config.codebook_dim
    _, h, w = schedule[1]
    good0 = torch.zeros(1, 1, 1, 1, d, dtype=torch.long)
    for bad in (
        torch.zeros(1, 1, h + 1, w, d, dtype=torch.long),
        torch.zeros(2, 1, h, w, d, dtype=torch.long),
        torch.zeros(1, h * w * d + 1, dtype=torch.long),
    ):
        message = assert_error(infinity, {"teacher_tokens": [good0, bad]}, ValueError, "teacher_tokens[1]")
        assert f"(1, 1, {h}, {w}, {d})" in message and str(tuple(bad.shape)) in message
    assert_error(infinity, {"teacher_tokens": [good0 + 2]}, ValueError, "teacher_tokens[0]", "[0, 1]")
    assert_error(infinity, {"teacher_tokens": good0}, TypeError, "teacher_tokens", "Tensor")
    too_many = [good0] * (len(schedule) + 1)
    assert_error(
        infinity, {"teacher_tokens": too_many}, ValueError, f"{len(schedule) + 1} entries", f"{len(schedule)} scales"
    )


def test_hart_teacher_tokens_of_the_wrong_shape(hart):
    patch_nums = hart.transformer.config.patch_nums
    vocab = hart.vae.quantize.embedding.weight.shape[0]
    good0 = torch.zeros(1, 1, dtype=torch.long)
    pn = patch_nums[2]
    for bad in (torch.zeros(1, pn * pn + 1, dtype=torch.long), torch.zeros(3, pn * pn, dtype=torch.long)):
        message = assert_error(
            hart,
            {"teacher_tokens": [good0, torch.zeros(1, patch_nums[1] ** 2, dtype=torch.long), bad]},
            ValueError,
            "teacher_tokens[2]",
        )
        assert f"(1, {pn * pn})" in message and str(tuple(bad.shape)) in message
    assert_error(hart, {"teacher_tokens": [good0 + vocab]}, ValueError, "teacher_tokens[0]", str(vocab))
    assert_error(hart, {"teacher_tokens": [["a"]]}, TypeError, "teacher_tokens[0]", "list")


# ---------------------------------------------------------------------------------------------------------------------
# batch = singles with one generator per image
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", [None, "lazyvar"])
@pytest.mark.parametrize("output_type", ["np", "pil"])
def test_generator_per_image_batch_reproduces_each_single_call(infinity, method, output_type):
    prompts = ["a red circle", "two blue squares", "a green triangle"]
    seeds = [0, 1, 2]
    scheduler = None
    if method == "lazyvar":
        from diffusers_var_accel import LazyVARScheduler

        scheduler = LazyVARScheduler.from_preset("infinity")
    batch = infinity(
        prompts,
        generator=[gen(s) for s in seeds],
        output_type=output_type,
        acceleration=scheduler,
        **EMBEDDED_SAMPLING,
    ).images
    for i, (prompt, seed) in enumerate(zip(prompts, seeds)):
        single = infinity(
            prompt, generator=gen(seed), output_type=output_type, acceleration=scheduler, **EMBEDDED_SAMPLING
        ).images
        assert np.array_equal(np.asarray(batch[i]), np.asarray(single[0])), (method, i)


def test_nan_check_does_not_reject_finite_extremes(infinity):
    """Large but finite values are valid numbers: they are not refused as non-finite."""
    out = infinity(
        PROMPT,
        guidance_scale=1e3,
        tau=1e-3,
        generator=gen(0),
        output_type="latent",
        **{k: v for k, v in EMBEDDED_SAMPLING.items() if k not in ("guidance_scale", "tau")},
    ).images
    assert torch.isfinite(out).all() and math.isfinite(float(out.abs().max()))


@pytest.mark.parametrize("value", [[0.0] * 16, "ids"])
def test_hart_position_ids_that_are_not_an_integer_tensor(hart, value):
    embeds = torch.zeros(1, text_tokens(hart), text_width(hart))
    ids = torch.zeros(1, text_tokens(hart)) if isinstance(value, list) else value
    assert_error(
        hart,
        {"prompt": None, "prompt_embeds": embeds, "prompt_position_ids": ids},
        TypeError,
        "prompt_position_ids",
        "float32" if isinstance(value, list) else "str",
    )


@pytest.mark.parametrize("kind", ["negative_prompt", "negative_prompt_embeds"])
def test_negative_prompt_without_guidance_warns(pipe, kind):
    off = {
        "guidance_scale": 1.0 if hasattr(pipe.transformer.config, "text_channels") else 0.0
    }  # Infinity: 1, HART: t = 0
    value = "a blue square" if kind == "negative_prompt" else torch.zeros(1, text_tokens(pipe), text_width(pipe))
    with pytest.warns(UserWarning, match=f"{kind} is ignored"):
        pipe(PROMPT, generator=gen(0), output_type="latent", **{kind: value}, **off)
