"""What every model family guarantees to the loop, the schedulers and the outer modules (the family conformance suite).

Parametrized over the registered families and a test-only toy third family (``tests/toy_family.py``, registered for
this module only), as ``test_method_conformance.py`` is over the methods. Each family:

* has a complete registry entry: its pipeline class is the family's, its "no guidance" value is what the pipeline
  calls guidance off;
* generates through an adapter that implements the six steps of :class:`ScaleModelFamily` and names its family;
* reproduces its baseline bit for bit with an identity scheduler, and call after call;
* runs only the conditional rows when guidance is off and both halves when it is on, and a CFG-halved pass on the
  rows of one half;
* shares its schedule tables between calls through the pipeline (and nothing else outlives the call);
* refuses a scheduler made for another family, naming both.

The toy family also runs every registered method and a composition with no edit outside its own file. The lab's
counters (the launch counter on every family, the FLOP meter on the toy through its declared parts) are checked in
``tests/lab/test_lab_families.py``.
"""

from __future__ import annotations

import pytest
import torch

from diffusers_var_accel import ComposedScheduler, IdentityScheduler, ScalePlan, VARAccelScheduler
from diffusers_var_accel.families import get_model_family, model_family_names
from diffusers_var_accel.next_scale import ScaleModelFamily
from diffusers_var_accel.next_scale.graphs import run_family_blocks
from diffusers_var_accel.schedulers.registry import METHODS

import toy_family
from toy_family import TOY

FAMILIES = [*model_family_names(), TOY]
#: The six steps of the family protocol.
STEPS = ("start", "embed", "run_blocks", "predict", "add_codes", "select_rows")
#: Call options that keep a family's tiny pipeline fast (a small image size); a family not named runs its default.
SMALL_CALLS = {"infinity": {"height": 144, "width": 432}}
#: Settings a method's Infinity preset needs on the toy's short schedule and 6 blocks (as on the tiny Infinity: see
#: test_method_conformance.SMALL_SCHEDULE_OVERRIDES).
TOY_OVERRIDES = {
    "depthvar": {"reference_scale": -3},
    "stagevar": {"num_chunks": 2, "rank_ratios": ((0.13648282097649195, 0.2502819846292948),)},
}
PROMPTS = ["a red fox in the snow", "two cats"]


@pytest.fixture(scope="module", autouse=True)
def toy_registered():
    with toy_family.registered() as family:
        yield family


@pytest.fixture(scope="module")
def family_pipes(pipes):
    """``family_pipes(name)``: the tiny pipeline of each family (the toy's own builder for the toy)."""
    built = {}

    def get(name):
        if name not in built:
            built[name] = toy_family.build_tiny_toy_pipeline() if name == TOY else pipes(name)
        return built[name]

    return get


class _PassSpy:
    """A pass runner that records the family adapter and the rows of every pass, then runs the blocks as usual."""

    def __init__(self):
        self.families, self.rows = [], []

    def __call__(self, family, hidden_RLC, condition, context):
        self.families.append(family)
        self.rows.append(hidden_RLC.shape[0])
        return run_family_blocks(family, hidden_RLC, condition, context)


def generate(pipe, name, guidance=None, spy=None, **kwargs):
    """Images of one call (guidance ``None``: the pipeline's default), with ``spy`` as the pass runner."""
    options = {**SMALL_CALLS.get(name, {}), **kwargs}
    if guidance is not None:
        options["guidance_scale"] = guidance
    pipe._pass_runner = spy
    try:
        return pipe(
            PROMPTS,
            generator=[torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)],
            output_type="pt",
            **options,
        ).images
    finally:
        pipe._pass_runner = None


def other_family(name):
    return next(other for other in FAMILIES if other != name)


@pytest.mark.parametrize("name", FAMILIES)
def test_registry_entry_matches_the_pipeline(name, family_pipes):
    family = get_model_family(name)
    pipe = family_pipes(name)
    assert isinstance(pipe, family.pipeline_class()) and pipe.model_family == name
    assert isinstance(family.no_guidance, float)
    assert not pipe.guided_call(family.no_guidance) and pipe.guided_call(family.no_guidance + 1.5)


@pytest.mark.parametrize("name", FAMILIES)
def test_the_adapter_implements_the_six_steps(name, family_pipes):
    pipe, spy = family_pipes(name), _PassSpy()
    generate(pipe, name, spy=spy)
    adapter = spy.families[0]
    assert all(f is adapter for f in spy.families)  # one adapter per call
    assert isinstance(adapter, ScaleModelFamily) and adapter.family == name
    for step in STEPS:
        assert getattr(type(adapter), step) is not getattr(ScaleModelFamily, step), (
            f"{type(adapter).__name__} lacks {step}"
        )
    assert adapter.num_layers == len(pipe.transformer.blocks)
    assert isinstance(adapter.num_start_tokens, int) and adapter.num_start_tokens >= 1


@pytest.mark.parametrize("name", FAMILIES)
def test_identity_scheduler_and_repeated_calls_are_the_baseline_bit_for_bit(name, family_pipes):
    pipe = family_pipes(name)
    baseline = generate(pipe, name)
    assert torch.equal(generate(pipe, name), baseline)
    assert torch.equal(generate(pipe, name, acceleration=IdentityScheduler(model_family=name)), baseline)
    assert torch.equal(generate(pipe, name, acceleration=IdentityScheduler()), baseline)


@pytest.mark.parametrize("name", FAMILIES)
def test_guidance_off_runs_the_conditional_rows_only(name, family_pipes):
    pipe, no_guidance = family_pipes(name), get_model_family(name).no_guidance
    off, on = _PassSpy(), _PassSpy()
    generate(pipe, name, guidance=no_guidance, spy=off)
    generate(pipe, name, guidance=no_guidance + 1.5, spy=on)
    assert set(off.rows) == {len(PROMPTS)} and set(on.rows) == {2 * len(PROMPTS)}


class _HalvedLast(VARAccelScheduler):
    """Every scale on its own; the last one runs the conditional half only (CFG halving)."""

    def plan_scales(self, scale_schedule, *args, **kwargs):
        n = len(scale_schedule)
        return [ScalePlan((i,), cfg_halve=i == n - 1) for i in range(n)]


@pytest.mark.parametrize("name", FAMILIES)
def test_a_halved_pass_runs_one_half(name, family_pipes):
    pipe, spy = family_pipes(name), _PassSpy()
    halved = generate(
        pipe, name, guidance=get_model_family(name).no_guidance + 1.5, spy=spy, acceleration=_HalvedLast()
    )
    assert spy.rows[:-1] == [2 * len(PROMPTS)] * (len(spy.rows) - 1) and spy.rows[-1] == len(PROMPTS)
    assert torch.isfinite(halved).all()


@pytest.mark.parametrize("name", FAMILIES)
def test_schedule_tables_are_shared_through_the_pipeline(name, family_pipes):
    pipe = family_pipes(name)
    pipe.schedule_tables.clear()
    first = generate(pipe, name)
    kept = dict(pipe.schedule_tables._tables)
    assert kept  # the scale ids at least
    second = generate(pipe, name)
    assert pipe.schedule_tables._tables.keys() == kept.keys()
    assert all(pipe.schedule_tables._tables[k] is v for k, v in kept.items())  # reused, not rebuilt
    pipe.schedule_tables.clear()
    assert torch.equal(generate(pipe, name), first) and torch.equal(second, first)


@pytest.mark.parametrize("name", FAMILIES)
def test_a_scheduler_for_another_family_is_refused(name, family_pipes):
    pipe, other = family_pipes(name), other_family(name)
    with pytest.raises(ValueError, match=f"{other!r}.*{name!r}"):
        generate(pipe, name, acceleration=IdentityScheduler(model_family=other))


# ---------------------------------------------------------------------------------------------------------------------
# the toy family runs every method with no edit outside its own file
# ---------------------------------------------------------------------------------------------------------------------
def toy_scheduler(method):
    """The method's Infinity preset, for the toy family."""
    cls = METHODS[method]
    return cls(**{**cls.presets["infinity"], "model_family": TOY, **TOY_OVERRIDES.get(method, {})})


@pytest.mark.parametrize("method", list(METHODS))
def test_the_toy_family_runs_every_method(method, family_pipes):
    pipe = family_pipes(TOY)
    baseline = generate(pipe, TOY)
    scheduler = toy_scheduler(method)
    accelerated = generate(pipe, TOY, acceleration=scheduler)
    assert accelerated.shape == baseline.shape and torch.isfinite(accelerated).all()
    assert not torch.equal(accelerated, baseline)  # the method acted
    assert torch.equal(generate(pipe, TOY, acceleration=scheduler), accelerated)  # no state carried across calls
    pipe.enable_acceleration(scheduler)
    try:
        assert torch.equal(generate(pipe, TOY), accelerated)
    finally:
        pipe.disable_acceleration()
    assert torch.equal(generate(pipe, TOY), baseline)
    assert pipe.kv_cache_bytes(scheduler) <= pipe.kv_cache_bytes()


def test_the_toy_family_runs_a_composition(family_pipes):
    pipe = family_pipes(TOY)
    composed = ComposedScheduler([toy_scheduler("lazyvar"), toy_scheduler("depthvar")])
    out = generate(pipe, TOY, acceleration=composed)
    assert torch.isfinite(out).all() and not torch.equal(out, generate(pipe, TOY))
