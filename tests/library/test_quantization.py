"""torchao weight quantisation, the diffusers way (issue 46, item 2): ``from_pretrained(...,
quantization_config=PipelineQuantizationConfig(quant_mapping=...))`` and ``torchao.quantization.quantize_`` with int8
and float8 weight-only, on both families (the embedded Infinity model and a tiny HART folder), with every method and
one composition; save / load of a quantised pipeline; the forms that cannot work refused before loading or saving,
naming the supported ones (:mod:`diffusers_var_accel.pipelines.quantization`)."""

from __future__ import annotations

import pytest
import torch

torchao = pytest.importorskip("torchao", reason="torchao is not installed (the test extra installs it)")

from diffusers import PipelineQuantizationConfig, TorchAoConfig  # noqa: E402
from torchao.quantization import Float8WeightOnlyConfig, Int8WeightOnlyConfig, quantize_  # noqa: E402
from transformers import TorchAoConfig as TransformersTorchAoConfig  # noqa: E402

from diffusers_var_accel import HARTPipeline, InfinityPipeline  # noqa: E402
from diffusers_var_accel.embedded import EMBEDDED_SAMPLING, embedded_model_path  # noqa: E402
from diffusers_var_accel.lab.metrics import psnr  # noqa: E402
from diffusers_var_accel.pipelines.hart.tiny import build_tiny_hart_pipeline  # noqa: E402
from diffusers_var_accel.schedulers.composition import ComposedScheduler  # noqa: E402
from diffusers_var_accel.schedulers.specs import load_acceleration  # noqa: E402
from registry_lists import METHODS  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

FORMS = {"int8": Int8WeightOnlyConfig, "float8": Float8WeightOnlyConfig}
WEIGHT_CLASSES = {"int8": "Int8Tensor", "float8": "Float8Tensor"}

#: The tiny HART runs 8 scales and 4 blocks: StageVAR one chunk per block (its preset splits 24), DepthVAR's
#: reference scale within the 8 (its preset's is scale 10).
OVERRIDES = {
    "hart": {"stagevar": ":num_chunks=4,rank_ratios=[[0.3,0.3,0.3,0.3]]", "depthvar": ":reference_scale=6"},
    "infinity": {},
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    hart = tmp_path_factory.mktemp("tiny-hart")
    build_tiny_hart_pipeline(seed=0, depth=4, embed_dim=32, tokenizer_ch_mult=(1,)).save_pretrained(hart)
    return {"infinity": embedded_model_path(), "hart": hart}


PIPELINES = {"infinity": InfinityPipeline, "hart": HARTPipeline}
SAMPLING = {"infinity": EMBEDDED_SAMPLING, "hart": dict(guidance_scale=4.5)}


def quant_mapping(form):
    return PipelineQuantizationConfig(
        quant_mapping={
            "transformer": TorchAoConfig(FORMS[form]()),
            "text_encoder": TransformersTorchAoConfig(FORMS[form]()),
        }
    )


def accelerations(family, pipe):
    """Every registered method's preset for the pipeline (the embedded model's own where it has them) and one
    composition (LazyVAR + DepthVAR, which composes on both families)."""
    out = {"baseline": None}
    for name in METHODS:
        out[name] = load_acceleration(name + OVERRIDES[family].get(name, ""), family, preset_model=pipe.preset_model)
    out["lazyvar+depthvar"] = ComposedScheduler([out["lazyvar"], out["depthvar"]])
    return out


def generate(pipe, family, acceleration):
    return pipe(
        "a red circle above a blue square",
        generator=torch.Generator().manual_seed(3),
        output_type="pt",
        acceleration=acceleration,
        **SAMPLING[family],
    ).images


def load(family, folder, **kwargs):
    pipe = PIPELINES[family].from_pretrained(folder, dtype=torch.float32, **kwargs)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def linear_weight_classes(module):
    return {type(m.weight).__name__ for m in module.modules() if isinstance(m, torch.nn.Linear)}


def quantised_weights(module):
    return {n: (p.qdata, p.scale) for n, p in module.named_parameters() if hasattr(p, "qdata")}


@pytest.mark.parametrize("family", ["infinity", "hart"])
@pytest.mark.parametrize("form", ["int8", "float8"])
def test_quantised_loading_quantises_as_quantize_does(folders, family, form):
    """``quantization_config`` quantises every Linear of the transformer and the text encoder, to the weights that
    ``quantize_`` makes of an unquantised load, bit for bit."""
    loaded = load(family, folders[family], quantization_config=quant_mapping(form))
    plain = load(family, folders[family])
    for name in ("transformer", "text_encoder"):
        assert linear_weight_classes(getattr(loaded, name)) == {WEIGHT_CLASSES[form]}, name
        quantize_(getattr(plain, name), FORMS[form]())
        expected, got = quantised_weights(getattr(plain, name)), quantised_weights(getattr(loaded, name))
        assert expected.keys() == got.keys() and len(got) > 0
        for key, (qdata, scale) in expected.items():
            assert torch.equal(got[key][0], qdata) and torch.equal(got[key][1], scale), (name, key)


@pytest.fixture(scope="module")
def embedded_images():
    """The unquantised embedded model's image of each method (the references of the fidelity test)."""
    plain = load("infinity", embedded_model_path())
    return {name: generate(plain, "infinity", a) for name, a in accelerations("infinity", plain).items()}


@pytest.mark.parametrize("form", ["int8", "float8"])
def test_quantised_embedded_model_stays_close_with_every_method(embedded_images, form):
    """On the trained embedded model, weight-only quantisation moves each method's image little: PSNR against the
    unquantised image of the same method above 25 dB (docs/memory.md has the table on 64 prompts), and each method
    changes the quantised image (it acts). int8 with every method and the composition, float8 with LazyVAR."""
    quantised = load("infinity", embedded_model_path(), quantization_config=quant_mapping(form))
    methods = accelerations("infinity", quantised)
    if form == "float8":
        methods = {k: methods[k] for k in ("baseline", "lazyvar")}
    images = {name: generate(quantised, "infinity", a) for name, a in methods.items()}
    for name, image in images.items():
        value = float(psnr(image, embedded_images[name]))
        assert value > 25.0, (name, value)
        if name != "baseline":
            assert not torch.equal(image, images["baseline"]), name


def test_quantised_tiny_hart_runs_every_method(folders):
    for form in ("int8", "float8"):
        pipe = load("hart", folders["hart"], quantization_config=quant_mapping(form))
        images = {name: generate(pipe, "hart", a) for name, a in accelerations("hart", pipe).items()}
        for name, image in images.items():
            assert torch.isfinite(image).all() and image.shape[:2] == (1, 3), (form, name)
            if name != "baseline":
                assert not torch.equal(image, images["baseline"]), (form, name)


@pytest.mark.parametrize("form", ["int8", "float8"])
def test_saved_quantised_pipeline_loads_to_the_same_images(folders, tmp_path, form):
    pipe = load("hart", folders["hart"], quantization_config=quant_mapping(form))
    lazyvar = accelerations("hart", pipe)["lazyvar"]
    image = generate(pipe, "hart", lazyvar)
    pipe.save_pretrained(tmp_path / "saved")
    # without dtype: each quantised component loads in the dtype it was saved in (diffusers would cast to bfloat16)
    again = HARTPipeline.from_pretrained(tmp_path / "saved")
    again.set_progress_bar_config(disable=True)
    assert linear_weight_classes(again.transformer) == {WEIGHT_CLASSES[form]}
    assert linear_weight_classes(again.text_encoder) == {WEIGHT_CLASSES[form]}
    assert torch.equal(generate(again, "hart", lazyvar), image)
    with pytest.raises(ValueError, match=r"saved with torch.float32.*load it with dtype=torch.float32"):
        HARTPipeline.from_pretrained(tmp_path / "saved", dtype=torch.bfloat16)


def test_quantize_then_save_is_refused_before_anything_is_written(folders, tmp_path):
    pipe = load("hart", folders["hart"])
    quantize_(pipe.transformer, Int8WeightOnlyConfig())
    with pytest.raises(ValueError, match=r"transformer holds weights quantised by torchao.quantization.quantize_"):
        pipe.save_pretrained(tmp_path / "saved")
    assert not (tmp_path / "saved").exists()


@pytest.mark.parametrize(
    "config, error, message",
    [
        (TorchAoConfig(Int8WeightOnlyConfig()), TypeError, r"must be a diffusers PipelineQuantizationConfig"),
        (
            PipelineQuantizationConfig(quant_mapping={"vae": TorchAoConfig(Int8WeightOnlyConfig())}),
            ValueError,
            r"names 'vae', which is not quantised.*allowed components: \['transformer', 'text_encoder'\]",
        ),
        (
            PipelineQuantizationConfig(quant_mapping={"text_encoder": TorchAoConfig(Int8WeightOnlyConfig())}),
            TypeError,
            r"quant_mapping\['text_encoder'\] is a diffusers.TorchAoConfig; the text_encoder takes "
            r"transformers.TorchAoConfig",
        ),
        (
            PipelineQuantizationConfig(
                quant_mapping={"transformer": TransformersTorchAoConfig(Int8WeightOnlyConfig())}
            ),
            TypeError,
            r"the transformer takes diffusers.TorchAoConfig",
        ),
        (
            PipelineQuantizationConfig(
                quant_mapping={"transformer": TorchAoConfig(torchao.quantization.Int4WeightOnlyConfig())}
            ),
            ValueError,
            r"torchao form Int4WeightOnlyConfig.*supported forms: \['Int8WeightOnlyConfig', 'Float8WeightOnlyConfig'\]",
        ),
    ],
    ids=["not-a-pipeline-config", "vae", "text-encoder-diffusers-config", "transformer-transformers-config", "int4"],
)
def test_unsupported_forms_are_refused_before_loading_naming_the_supported_ones(config, error, message):
    with pytest.raises(error, match=message) as info:
        InfinityPipeline.from_pretrained("embedded", quantization_config=config)
    assert "Int8WeightOnlyConfig() or Float8WeightOnlyConfig()" in str(info.value)


def test_the_quant_backend_form_fails_inside_diffusers_before_any_pipeline_code():
    """diffusers 0.42.1 with transformers 5.x refuses the ``quant_backend=`` form in the config's constructor (its
    message already points to ``quant_mapping``); if a later diffusers accepts it, the pipelines' own check refuses it
    before loading."""
    try:
        config = PipelineQuantizationConfig(
            quant_backend="torchao",
            quant_kwargs={"quant_type": Int8WeightOnlyConfig()},
            components_to_quantize=["transformer"],
        )
    except ValueError as err:
        assert "quant_mapping" in str(err)
        return
    with pytest.raises(ValueError, match=r"quant_backend= form .* is not supported"):
        InfinityPipeline.from_pretrained("embedded", quantization_config=config)
