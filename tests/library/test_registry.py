"""The registries of methods and model families, enabling by name, the generated shortcuts, and the docs' fifth
method (defined from the code block of docs/acceleration.md, run, and removed again)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch

import diffusers_var_accel.schedulers
from diffusers_var_accel import ARVARScheduler, HARTPipeline, InfinityPipeline, LazyVARScheduler
from diffusers_var_accel.families import MODEL_FAMILIES, get_model_family, model_family_names
from diffusers_var_accel.schedulers.registry import METHODS, get_method, method_names, unregister_method
from diffusers_var_accel.schedulers.composition import ComposedScheduler
from diffusers_var_accel.schedulers.scheduling_var_base import VARAccelScheduler
from diffusers_var_accel.schedulers.specs import build_acceleration, load_acceleration
from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline

DOCS = Path(__file__).resolve().parents[2] / "docs" / "acceleration.md"
SIZE = dict(height=256, width=256)
#: The package's scheduler modules and their methods, found by a rule (``scheduling_<method>.py`` defines the method
#: ``<method>``), not typed by hand; the registry must hold exactly these, in the order the package imports them.
SCHEDULERS_DIR = Path(diffusers_var_accel.schedulers.__file__).parent
METHOD_MODULES = sorted(p.stem for p in SCHEDULERS_DIR.glob("scheduling_*.py") if p.stem != "scheduling_var_base")
LIBRARY_METHODS = {name: cls for name, cls in METHODS.items() if cls.__module__.startswith("diffusers_var_accel.")}


@pytest.fixture(scope="module")
def pipe():
    p = build_tiny_infinity_pipeline(seed=0, depth=4)
    p.set_progress_bar_config(disable=True)
    return p


def _latents(pipe, **kwargs):
    return pipe(
        "a red circle",
        generator=torch.Generator().manual_seed(0),
        output_type="latent",
        guidance_scale=3.0,
        **SIZE,
        **kwargs,
    ).images


# -- registry contents ------------------------------------------------------------------------------------------------
def test_method_registry_holds_every_scheduler_module_of_the_package_in_order_with_their_presets():
    assert sorted(f"scheduling_{name}" for name in LIBRARY_METHODS) == METHOD_MODULES and len(METHOD_MODULES) >= 5
    # the registration order is the package's import order (schedulers/__init__.py), the order of every method list
    init = (SCHEDULERS_DIR / "__init__.py").read_text(encoding="utf-8")
    assert list(LIBRARY_METHODS) == sorted(LIBRARY_METHODS, key=lambda name: init.index(f".scheduling_{name} import"))
    assert method_names()[: len(LIBRARY_METHODS)] == list(LIBRARY_METHODS)
    for name, cls in LIBRARY_METHODS.items():
        assert get_method(name) is cls and cls.__module__ == f"diffusers_var_accel.schedulers.scheduling_{name}"
        assert set(cls.presets) == set(MODEL_FAMILIES), name  # every method has a preset per family
        assert cls.presets.names() == {f: f"{MODEL_FAMILIES[f].preset_model}/{name}" for f in MODEL_FAMILIES}


def test_family_registry_names_preset_model_and_pipeline():
    assert model_family_names() == ["hart", "infinity"]
    assert get_model_family("infinity").pipeline_class() is InfinityPipeline
    assert get_model_family("hart").pipeline_class() is HARTPipeline
    for name, family in MODEL_FAMILIES.items():
        assert family.pipeline_class().model_family == name
    with pytest.raises(ValueError, match=r"unknown model family 'sd'.*\['hart', 'infinity'\]"):
        get_model_family("sd")
    with pytest.raises(ValueError, match=r"model_family must be one of \['hart', 'infinity'\]"):
        LazyVARScheduler(model_family="sd")


def test_a_name_taken_by_another_class_is_refused():
    with pytest.raises(ValueError, match="already registered by LazyVARScheduler"):

        class OtherLazy(VARAccelScheduler, method="lazyvar"):  # noqa: F841
            pass

    assert METHODS["lazyvar"] is LazyVARScheduler
    with pytest.raises(ValueError, match="lowercase identifier"):

        class Bad(VARAccelScheduler, method="Lazy-VAR"):  # noqa: F841
            pass


# -- enable by name ---------------------------------------------------------------------------------------------------
def test_enable_by_name_equals_the_preset_shortcut(pipe):
    scheduler = pipe.enable_acceleration("lazyvar", keep_ratios=(0.5, 0.3, 0.2, 0.1))
    assert isinstance(scheduler, LazyVARScheduler) and pipe.acceleration is scheduler
    assert list(scheduler.config.keep_ratios) == [0.5, 0.3, 0.2, 0.1]
    by_name = _latents(pipe)
    pipe.enable_lazyvar(keep_ratios=(0.5, 0.3, 0.2, 0.1))
    assert torch.equal(_latents(pipe), by_name)
    assert torch.equal(
        _latents(pipe, acceleration="lazyvar"), _latents(pipe, acceleration=LazyVARScheduler.from_preset("infinity"))
    )
    pipe.disable_acceleration()
    assert not torch.equal(_latents(pipe), by_name)


def test_enable_a_composition_by_name(pipe):
    # ARVAR's branch halving before LazyVAR's group (on the tiny model's 7 scales its preset's scales fall in the group)
    arvar = {"branch_halving_scales": (-5,), "pruned_scales": ()}
    composed = pipe.enable_acceleration("lazyvar+arvar", arvar=arvar)
    assert isinstance(composed, ComposedScheduler) and composed.model_family == "infinity"
    assert [type(m) for m in composed.members] == [LazyVARScheduler, ARVARScheduler]
    assert list(composed.members[1].config.branch_halving_scales) == [-5]
    accelerated = _latents(pipe)
    expected = ComposedScheduler(
        [LazyVARScheduler.from_preset("infinity"), ARVARScheduler.from_preset("infinity", **arvar)],
        model_family="infinity",
    )
    assert torch.equal(accelerated, _latents(pipe, acceleration=expected))
    assert not torch.equal(accelerated, _latents(pipe, acceleration="lazyvar"))
    pipe.disable_acceleration()
    hart = load_acceleration("lazyvar+arvar", "hart")  # the command line's and the benchmark's spec
    assert isinstance(hart, ComposedScheduler) and hart.model_family == "hart"
    assert [m.model_family for m in hart.members] == ["hart", "hart"]


def test_bad_names_and_overrides_fail_clearly(pipe):
    with pytest.raises(
        ValueError,
        match=r"unknown acceleration method 'lazyvra' \(did you mean 'lazyvar'\?\); known "
        r"methods: " + re.escape(str(method_names())),
    ):
        pipe.enable_acceleration("lazyvra")
    with pytest.raises(ValueError, match=r"unknown acceleration method 'nope'.*known methods"):
        pipe.enable_acceleration("lazyvar+nope")
    with pytest.raises(
        ValueError, match=r"composition: its overrides are per member.*'keep_ratios' names none of its members"
    ):
        pipe.enable_acceleration("lazyvar+arvar", keep_ratios=(0.5,))
    with pytest.raises(ValueError, match="must be a dict"):
        pipe.enable_acceleration("lazyvar+arvar", arvar=0.5)
    with pytest.raises(ValueError, match=r"\['lazyvar'\] more than once"):
        pipe.enable_acceleration("lazyvar+lazyvar")
    with pytest.raises(ValueError, match="LazyVARScheduler has no setting"):
        pipe.enable_acceleration("lazyvar", keep_ratio=0.5)
    with pytest.raises(ValueError, match="instance is attached as it is"):
        pipe.enable_acceleration(LazyVARScheduler.from_preset("infinity"), keep_ratios=(0.5,))
    with pytest.raises(ValueError, match=r"takes no ':key=value' overrides"):
        load_acceleration("lazyvar+arvar:keep_ratios=[0.5]", "infinity")
    assert getattr(pipe, "acceleration", None) is None  # nothing was attached by a failed call


# -- shortcuts: one generated per registered method, the library's own included ------------------------------------
@pytest.mark.parametrize("name", list(LIBRARY_METHODS))
def test_every_library_method_has_its_generated_shortcut_with_a_docstring(name):
    cls = LIBRARY_METHODS[name]
    shortcut = getattr(InfinityPipeline, f"enable_{name}")
    assert shortcut is getattr(HARTPipeline, f"enable_{name}") and shortcut.__name__ == f"enable_{name}"
    assert shortcut.registered_method == name  # the registry's, not a second hand-written one
    doc = inspect.getdoc(shortcut)
    summary = " ".join(inspect.getdoc(cls).split("\n\n")[0].split())
    assert summary in " ".join(doc.split()) and f"[`{cls.__name__}`]" in doc
    assert "Args:" in doc and "**overrides" in doc and "Returns:" in doc and "Examples:" in doc
    assert str(inspect.signature(shortcut)) == "(self, **overrides: 'Any') -> 'VARAccelScheduler'"


def test_the_mixin_writes_out_no_shortcut():
    """One mechanism: the class body defines no ``enable_<method>``; every one comes from the registry."""
    from diffusers_var_accel.pipelines.acceleration_mixin import VARAccelerationMixin

    source = inspect.getsource(VARAccelerationMixin)
    assert re.findall(r"\n    def enable_(\w+)\(", source) == ["acceleration"]
    assert {n for n in vars(VARAccelerationMixin) if n.startswith("enable_") and n != "enable_acceleration"} == {
        f"enable_{name}" for name in METHODS
    }


# -- the fifth method of the docs -------------------------------------------------------------------------------------
def _fifth_method_code() -> str:
    text = DOCS.read_text(encoding="utf-8")
    section = text[text.index("## Adding a fifth method") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_docs_fifth_method_registers_runs_composes_and_is_removed(pipe):
    assert "lastcfg" not in METHODS
    baseline = _latents(pipe)
    namespace = {"__name__": "docs_fifth_method"}
    exec(compile(_fifth_method_code(), str(DOCS), "exec"), namespace)  # defining the class registers it
    cls = namespace["LastScaleCFGScheduler"]
    try:
        assert METHODS["lastcfg"] is cls and method_names()[-1] == "lastcfg"
        assert "Last-scale CFG halving" in inspect.getdoc(InfinityPipeline.enable_lastcfg)
        accelerated = _latents(pipe, acceleration="lastcfg")
        assert not torch.equal(accelerated, baseline)
        # the same plan as ARVAR's branch halving alone at the last scale (an independent implementation of it)
        arvar_bh = ARVARScheduler(
            branch_halving_scales=(-1,), pruned_scales=(), prune_ratios=(0.25,), model_family="infinity"
        )
        assert torch.equal(accelerated, _latents(pipe, acceleration=arvar_bh))
        scheduler = pipe.enable_acceleration("lastcfg")
        assert isinstance(scheduler, cls) and torch.equal(_latents(pipe), accelerated)
        pipe.enable_lastcfg(halved_scales=(-2, -1))
        assert not torch.equal(_latents(pipe), accelerated)
        composed = pipe.enable_acceleration("lazyvar+lastcfg", lastcfg={"halved_scales": (-1,)})
        assert [type(m) for m in composed.members] == [LazyVARScheduler, cls]
        assert not torch.equal(_latents(pipe), _latents(pipe, acceleration="lazyvar"))
        assert isinstance(load_acceleration("lastcfg", "infinity"), cls)
        pipe.disable_acceleration()
        assert torch.equal(_latents(pipe), baseline)
    finally:
        pipe.disable_acceleration()
        unregister_method("lastcfg")
    assert "lastcfg" not in METHODS and not hasattr(InfinityPipeline, "enable_lastcfg")
    with pytest.raises(ValueError, match=r"unknown acceleration method 'lastcfg'; known methods"):
        pipe.enable_acceleration("lastcfg")
    with pytest.raises(ValueError, match="lastcfg"):
        build_acceleration("lazyvar+lastcfg", "infinity")
    assert torch.equal(_latents(pipe), baseline)
