"""What every acceleration method guarantees, on every model family it has a preset for.

One parametrized suite over (method, family): FastVAR, LazyVAR, DepthVAR and ARVAR on a tiny random Infinity (7-scale
schedules, the 0.06M budget) and a tiny random HART (the first 10 scales of HART-0.7B's schedule). Each case checks:

* the configuration survives ``save_pretrained`` / ``from_pretrained`` (``to_dict`` equality, same plans);
* disabled acceleration is the baseline bit for bit after any enable / disable sequence;
* a batch with one generator per image equals the images generated one at a time (for a method that ranks every
  token by a continuous score, on the scales before it acts), and each image of a batch is independent of the
  others bit for bit;
* no state is carried across calls: two identical calls give identical images, and the scheduler holds no tensor;
* one size of each aspect class of the family (square, the tallest, the widest) runs;
* a scheduler configured for the other family is refused with an error naming both families;
* bad settings raise ``ValueError`` naming the setting and the bad value.

Method-specific behaviour (what a method computes) stays in ``test_scheduler_<method>.py`` and
``test_hart_acceleration.py``.
"""

from __future__ import annotations

import json

import pytest
import torch

from diffusers_var_accel import (
    HART_CONFIGS,
    IdentityScheduler,
    VARAccelScheduler,
    schedule_for_size,
    supported_sizes,
)
from registry_lists import METHOD_FAMILY_CASES as CASES
from registry_lists import METHODS, OTHER_FAMILY, TINY_MODEL_OVERRIDES, tiny_preset

INFINITY_SIZES = sorted(hw for hw, (_, budget) in supported_sizes().items() if budget == "0.06M")
HART_PATCH_NUMS = HART_CONFIGS["hart-0.7b"]["patch_nums"][:10]
PROMPTS = ["a red fox in the snow", "two cats"]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def sizes(family):
    return INFINITY_SIZES if family == "infinity" else [None]


def images(pipe, family, acceleration=None, prompt=PROMPTS[0], generator=None, size=None, tokens=None):
    """The images of one call; with ``tokens`` (a dict), also the sampled tokens of every scale that sampled any."""
    size = size or (sizes(family)[0] if family == "infinity" else None)
    kwargs = {} if size is None else {"height": size[0], "width": size[1]}

    def record(p, scale_index, scale, values):
        if tokens is not None and values["tokens"] is not None:
            tokens[scale_index] = values["tokens"].clone()
        return {}

    return pipe(
        prompt,
        generator=generator if generator is not None else gen(0),
        acceleration=acceleration,
        guidance_scale=3.0,
        output_type="pt",
        callback_on_step_end=record,
        callback_on_step_end_tensor_inputs=["tokens"],
        **kwargs,
    ).images


def as_json(value):
    return json.loads(json.dumps(value))


def preset(method, family, **overrides):
    return tiny_preset(method, family, **overrides)


@pytest.fixture(scope="module")
def baselines(pipes):
    cache = {}

    def get(family):
        if family not in cache:
            cache[family] = images(pipes(family), family)
        return cache[family]

    return get


# ---------------------------------------------------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method, family", CASES)
def test_json_round_trip(method, family, tmp_path):
    scheduler = preset(method, family)
    scheduler.save_pretrained(tmp_path)
    loaded = METHODS[method].from_pretrained(tmp_path)
    generic = VARAccelScheduler.from_pretrained(tmp_path)
    assert type(loaded) is METHODS[method] and type(generic) is METHODS[method]
    # to_dict gives plain JSON values (lists, never tuples), so the loaded configuration equals the preset's as it is
    assert loaded.to_dict() == scheduler.to_dict() == generic.to_dict() == as_json(scheduler.to_dict())
    assert loaded.to_json_string() == scheduler.to_json_string()
    assert loaded.model_family == family
    schedule = [(1, h, h) for h in HART_PATCH_NUMS] if family == "hart" else schedule_for_size(*INFINITY_SIZES[0])[0]
    assert loaded.plan_scales(schedule) == scheduler.plan_scales(schedule)
    with pytest.raises(ValueError, match="no setting"):
        METHODS[method].from_pretrained(tmp_path, not_a_setting=1)
    with pytest.raises(ValueError, match="model_family must be one of"):
        METHODS[method].from_pretrained(tmp_path, model_family="sd")  # an override is checked as a setting
    with pytest.raises(ValueError, match=METHODS[method].__name__):  # another class's folder, named
        IdentityScheduler.from_pretrained(tmp_path)


@pytest.mark.parametrize("method, family", CASES)
def test_every_setting_of_the_grid_round_trips_and_overrides_on_load(method, family, tmp_path):
    """Settings other than the preset's (the method's calibration grid: tuples, negative scale indices, strings)
    survive the JSON round trip, and an override given to ``from_pretrained`` (by the class or by the generic base)
    replaces the stored value."""
    schedule = [(1, h, h) for h in HART_PATCH_NUMS] if family == "hart" else schedule_for_size(*INFINITY_SIZES[0])[0]
    grid = METHODS[method].calibration_grid(6)
    assert grid, method
    for i, settings in enumerate(grid):
        folder = tmp_path / str(i)
        scheduler = METHODS[method](**settings)
        scheduler.save_pretrained(folder)
        loaded = METHODS[method].from_pretrained(folder)
        assert type(loaded) is METHODS[method] and loaded.to_dict() == scheduler.to_dict() == as_json(
            scheduler.to_dict()
        )
        try:
            plans = scheduler.plan_scales(schedule)
        except ValueError:  # a grid setting the short tiny schedule cannot take is refused by both alike
            with pytest.raises(ValueError):
                loaded.plan_scales(schedule)
        else:
            assert loaded.plan_scales(schedule) == plans
    # an override on load: a value of the grid, different from the first setting's, that the first setting takes
    first, folder = grid[0], tmp_path / "0"
    candidates = [(k, g[k]) for g in grid[1:] for k in g if k in first and as_json(g[k]) != as_json(first[k])]
    taken = []
    for name, value in candidates:
        try:
            taken.append((name, value, METHODS[method](**{**first, name: value}).to_dict()))
        except ValueError:  # a setting that needs others changed with it
            continue
    assert taken, f"{method}: no single setting of its grid can be overridden"
    name, value, expected = taken[0]
    for cls in (METHODS[method], VARAccelScheduler):
        overridden = cls.from_pretrained(folder, **{name: value})
        assert type(overridden) is METHODS[method] and overridden.to_dict() == expected
        assert as_json(overridden.to_dict()[name]) == as_json(value)


@pytest.mark.parametrize("method, family", CASES)
def test_a_scheduler_for_the_other_family_is_refused(method, family, pipes):
    other = OTHER_FAMILY[family]
    if other is None:
        pytest.skip("one model family is registered: there is no other family's preset")
    if other not in METHODS[method].presets:
        pytest.skip(f"{method} has no {other} preset")
    pipe, foreign = pipes(family), METHODS[method].from_preset(other)
    with pytest.raises(ValueError, match=f"{other!r}.*{family!r}"):
        pipe.enable_acceleration(foreign)
    assert pipe.acceleration is None
    with pytest.raises(ValueError, match=f"{other!r}.*{family!r}"):
        images(pipe, family, acceleration=foreign)


# (settings, name of the setting, the bad value as the message writes it)
BAD_SETTINGS = {
    "fastvar": [
        (dict(prune_ratios=(0.4, 1.5)), "prune ratio", "1.5"),
        (dict(prune_ratios=(-0.1, 0.5)), "prune ratio", "-0.1"),
        (dict(pruned_layers=(5, 3)), "pruned_layers", "[5, 3]"),
        (dict(prune_scales=(-4, 2.5)), "prune_scales", "2.5"),
        (dict(cache_scale=1.0), "cache_scale", "1.0"),
        (dict(skip_last_scales="yes"), "skip_last_scales", "'yes'"),
        (dict(model_family="var"), "model_family", "'var'"),
    ],
    "lazyvar": [
        (dict(keep_ratios=(0.2, 0.1, 0.05, 1.5)), "keep_ratios[3]", "1.5"),
        (dict(keep_ratios=(-0.1, 0.1, 0.05, 0.01)), "keep_ratios[0]", "-0.1"),
        (dict(group_scales=(-4, -2, -1), keep_ratios=(0.1, 0.1, 0.1)), "group_scales", "(-4, -2, -1)"),
        (dict(group_scales=(0, 1), keep_ratios=(0.1, 0.1)), "group_scales", "(0, 1)"),
        (dict(cumulative_index="area"), "cumulative_index", "'area'"),
        (dict(parallel_decoding="yes"), "parallel_decoding", "'yes'"),
        (dict(model_family="dalle"), "model_family", "'dalle'"),
    ],
    "depthvar": [
        (dict(reference_scale=0), "reference_scale", "0"),
        (dict(reference_scale=2.5), "reference_scale", "2.5"),
        (dict(start_scale="late"), "start_scale", "'late'"),
        (dict(rotation_step=1.0), "rotation_step", "1.0"),
        (dict(rotation_step=-0.1), "rotation_step", "-0.1"),
        (dict(min_depth=-1), "min_depth", "-1"),
        (dict(min_depth=1.5), "min_depth", "1.5"),
        (dict(cyclic_layer_offsets="yes"), "cyclic_layer_offsets", "'yes'"),
        (dict(code_blending=1), "code_blending", "1"),
        (dict(model_family="dalle"), "model_family", "'dalle'"),
    ],
    "stagevar": [
        (dict(unconditional_scales=(-1, 2.5)), "unconditional_scales", "2.5"),
        (dict(rank_ratios=((0.2,) * 7 + (1.5,),)), "rank_ratios", "1.5"),
        (dict(num_chunks=0), "num_chunks", "0"),
        (dict(rank_basis="width"), "rank_basis", "'width'"),
        (dict(mixture_positions="last"), "mixture_positions", "'last'"),
        (dict(projection_seed=1.5), "projection_seed", "1.5"),
        (dict(model_family="dalle"), "model_family", "'dalle'"),
    ],
    "arvar": [
        (dict(prune_ratios=(1.5,)), "prune_ratios[0]", "1.5"),
        (dict(pruned_layers=(3, 2)), "pruned_layers", "[3, 2]"),
        (dict(upsample_mode="trilinear"), "upsample_mode", "'trilinear'"),
        (dict(attention_distance=0), "attention_distance", "0"),
        (dict(activation_distance=-1), "activation_distance", "-1"),
        (dict(branch_halving_scales=(1.5,)), "branch_halving_scales", "1.5"),
        (dict(model_family="dalle"), "model_family", "'dalle'"),
    ],
}
BAD_CASES = [(method, *case) for method, cases in BAD_SETTINGS.items() for case in cases]


@pytest.mark.parametrize(
    "method, settings, name, value", BAD_CASES, ids=[f"{m}-{'-'.join(s)}-{v}" for m, s, _, v in BAD_CASES]
)
def test_bad_settings_raise_naming_the_value(method, settings, name, value):
    with pytest.raises(ValueError) as error:
        METHODS[method](**settings)
    message = str(error.value)
    assert name in message and value in message, message


def test_every_method_has_bad_setting_cases():
    assert set(BAD_SETTINGS) == set(METHODS) and all(len(cases) >= 5 for cases in BAD_SETTINGS.values())


# ---------------------------------------------------------------------------------------------------------------------
# generation
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method, family", CASES)
def test_disabled_is_the_baseline_after_any_enable_disable_sequence(method, family, pipes, baselines):
    pipe, baseline, enable = pipes(family), baselines(family), getattr(pipes(family), f"enable_{method}")
    overrides = TINY_MODEL_OVERRIDES.get((method, family), {})
    try:
        scheduler = enable(**overrides)
        assert isinstance(scheduler, METHODS[method]) and pipe.acceleration is scheduler
        assert as_json(scheduler.to_dict()) == as_json(preset(method, family).to_dict())
        accelerated = images(pipe, family)
        assert not torch.equal(accelerated, baseline)  # the method acted
        pipe.disable_acceleration()
        assert torch.equal(images(pipe, family), baseline)
        enable(**overrides)
        enable(**overrides)  # enabling twice replaces, it does not stack
        assert torch.equal(images(pipe, family), accelerated)
        pipe.disable_acceleration()
        pipe.disable_acceleration()  # disabling twice is harmless
        assert pipe.acceleration is None
        assert torch.equal(images(pipe, family), baseline)
        assert torch.equal(images(pipe, family, acceleration=preset(method, family)), accelerated)  # per call
        assert torch.equal(images(pipe, family), baseline)
    finally:
        pipe.disable_acceleration()


def schedule_of(pipe, family, size=None):
    """The scale schedule of a call of :func:`images`."""
    if family == "hart":
        return [(1, p, p) for p in HART_PATCH_NUMS]
    return pipe.scale_schedule_for(*(size or sizes(family)[0]))[0]


@pytest.mark.parametrize("method, family", CASES)
def test_batch_with_one_generator_per_image_equals_single_runs(method, family, pipes):
    """Infinity: the images bit for bit. HART: batched fp32 matmuls round differently from single ones (the baseline's
    images differ by up to ~3e-4, see test_pipeline_hart.py), which can flip a sampled token that sits on a near-tie;
    so the tokens must agree at every position but at most one, and the images within 5e-4 where every token agrees.
    A method that mixed the rows of a batch would change far more than one token.

    A method that orders every token by a continuous score (``batch_equals_single_runs = False``: DepthVAR) sees that
    rounding in its ranking, which can swap two near-tied ranks (seen on some CPUs, not on others); it is held to this
    on the scales before the first one it acts on, and to bit-equal rows at equal batch size (next test)."""
    pipe, scheduler, seeds = pipes(family), preset(method, family), (11, 22)
    compared = None if scheduler.batch_equals_single_runs else min(scheduler.acted_scales(schedule_of(pipe, family)))
    batch_tokens = {}
    batch = images(pipe, family, scheduler, prompt=PROMPTS, generator=[gen(s) for s in seeds], tokens=batch_tokens)
    assert batch.shape[0] == 2 and batch_tokens
    for i, (prompt, seed) in enumerate(zip(PROMPTS, seeds)):
        single_tokens = {}
        single = images(pipe, family, scheduler, prompt=prompt, generator=[gen(seed)], tokens=single_tokens)
        assert sorted(single_tokens) == sorted(batch_tokens)
        if compared is not None:
            single_tokens = {k: t for k, t in single_tokens.items() if k < compared}
            assert single_tokens, f"no scale before {method}'s first acted scale {compared} to compare"
        differing = sum(int((batch_tokens[k][i : i + 1] != tokens).sum()) for k, tokens in single_tokens.items())
        if family == "infinity":
            assert differing == 0, prompt
            if compared is None:
                assert torch.equal(batch[i], single[0]), prompt
        else:
            assert differing <= 1, (prompt, differing)
            if differing == 0 and compared is None:
                torch.testing.assert_close(batch[i], single[0], atol=5e-4, rtol=0)


@pytest.mark.parametrize("method, family", CASES)
def test_each_image_of_a_batch_is_independent_of_the_others(method, family, pipes):
    """Bit for bit on any CPU, for every method and family: the first image of a batch of 2 (tokens of every scale
    and the image) does not change when the second image's generator does. The shapes are equal, so every kernel
    rounds the first rows alike; any mixing of rows (a ranking over the batch, a shared mask) would show."""
    pipe, scheduler = pipes(family), preset(method, family)
    tokens_a, tokens_b = {}, {}
    a = images(pipe, family, scheduler, prompt=PROMPTS, generator=[gen(11), gen(22)], tokens=tokens_a)
    b = images(pipe, family, scheduler, prompt=PROMPTS, generator=[gen(11), gen(33)], tokens=tokens_b)
    assert sorted(tokens_a) == sorted(tokens_b)
    for k in tokens_a:
        assert torch.equal(tokens_a[k][:1], tokens_b[k][:1]), (method, family, k)
    assert torch.equal(a[0], b[0])
    assert not torch.equal(a[1], b[1])  # the second generator does reach the second image


@pytest.mark.parametrize("method, family", CASES)
def test_no_state_is_carried_across_calls(method, family, pipes):
    pipe, scheduler = pipes(family), preset(method, family)
    before = scheduler.to_dict()
    first = images(pipe, family, scheduler)
    assert not [name for name, value in vars(scheduler).items() if isinstance(value, torch.Tensor)]
    assert not any(isinstance(value, torch.Tensor) for value in dict(scheduler.config).values())
    second = images(pipe, family, scheduler)
    assert torch.equal(first, second)
    assert scheduler.to_dict() == before
    for module in pipe.transformer.modules():
        for name, value in vars(module).items():
            if name not in ("_parameters", "_buffers", "_modules"):
                assert not isinstance(value, torch.Tensor), f"{type(module).__name__}.{name}"


def aspect_class_sizes(family):
    """One size per aspect class of the family's supported sizes: square, the tallest and the widest (the extremes,
    where a method's per-scale token counts are least like the square schedule's). Every template runs the baseline
    in test_pipeline_infinity.py."""
    if family != "infinity":
        return [None]
    square = [hw for hw in INFINITY_SIZES if hw[0] == hw[1]]
    return square[:1] + [
        max(INFINITY_SIZES, key=lambda hw: hw[0] / hw[1]),
        min(INFINITY_SIZES, key=lambda hw: hw[0] / hw[1]),
    ]


ASPECT_CASES = [(method, family, size) for method, family in CASES for size in aspect_class_sizes(family)]


@pytest.mark.parametrize(
    "method, family, size",
    ASPECT_CASES,
    ids=[f"{m}-{f}-{'x'.join(map(str, s)) if s else 'default'}" for m, f, s in ASPECT_CASES],
)
def test_every_aspect_class_runs(method, family, size, pipes):
    pipe = pipes(family)
    out = images(pipe, family, preset(method, family), size=size)
    assert torch.isfinite(out).all()
    if size is not None:
        assert out.shape[-2:] == size
