"""Every transformer pass compiles as one graph (``fullgraph=True``) for the baseline and every preset on both
models, gives the eager result, and a second call replays the graphs without compiling anything (issue 17: the
CPU check of per-pass CUDA graphs; the ``eager`` backend captures with TorchDynamo as inductor does, without code
generation)."""

import warnings

import pytest
import torch
from torch._dynamo.utils import counters

from diffusers_var_accel import InfinityPipeline
from diffusers_var_accel.embedded import EMBEDDED_SAMPLING
from diffusers_var_accel.models.transformer_hart import HART_CONFIGS
from diffusers_var_accel.utils.tiny import build_tiny_hart_pipeline

METHODS = ["baseline", "fastvar", "lazyvar", "depthvar", "arvar"]


@pytest.fixture(scope="module")
def pipelines():
    emb = InfinityPipeline.from_pretrained("embedded")
    hart = build_tiny_hart_pipeline(seed=0, depth=2, patch_nums=HART_CONFIGS["hart-0.7b"]["patch_nums"])
    for pipe in (emb, hart):
        pipe.set_progress_bar_config(disable=True)
    return {
        "infinity": (emb, dict(prompt=["two red circles", "a yellow triangle"], **EMBEDDED_SAMPLING)),
        "hart": (hart, dict(prompt=["a red fox"], guidance_scale=4.5)),
    }


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _generate(pipe, kwargs):
    return pipe(**kwargs, generator=torch.Generator().manual_seed(3), output_type="pt").images


@pytest.mark.parametrize("model", ["infinity", "hart"])
@pytest.mark.parametrize("method", METHODS)
def test_every_pass_compiles_once_and_matches_eager(pipelines, model, method):
    pipe, kwargs = pipelines[model]
    pipe.disable_acceleration()
    if method != "baseline":
        getattr(pipe, f"enable_{method}")()
    try:
        eager = _generate(pipe, kwargs)
        pipe.compile_passes(backend="eager", fullgraph=True)
        assert pipe.passes_compiled
        compiled_runner, passes = pipe._pass_runner, []

        def counting_runner(family, hidden, condition, context):
            passes.append(tuple(context.scale_hws))
            return compiled_runner(family, hidden, condition, context)

        pipe._pass_runner = counting_runner
        counters.clear()
        first = _generate(pipe, kwargs)
        graphs = counters["stats"]["unique_graphs"]
        assert passes and graphs == len(passes)  # one graph per pass, none split (fullgraph would raise anyway)
        assert not counters["graph_break"]
        assert torch.equal(first, eager)
        passes.clear()
        second = _generate(pipe, kwargs)
        assert len(passes) == graphs
        assert counters["stats"]["unique_graphs"] == graphs  # nothing recompiled on the second call
        assert torch.equal(second, eager)
    finally:
        pipe.disable_cuda_graphs()
        pipe.disable_acceleration()
    assert not pipe.passes_compiled


def test_cuda_graphs_say_they_do_nothing_off_cuda(pipelines):
    pipe, _ = pipelines["hart"]
    with pytest.warns(UserWarning, match="enable_cuda_graphs\\(\\) does nothing on the cpu device"):
        assert pipe.enable_cuda_graphs() is False
    assert not pipe.passes_compiled
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pipe.disable_cuda_graphs()


def test_compiled_passes_raise_the_dynamo_cache_limit_and_eager_gives_it_back(pipelines):
    config = torch._dynamo.config
    before = config.cache_size_limit
    emb, hart = pipelines["infinity"][0], pipelines["hart"][0]
    try:
        config.cache_size_limit = 8
        emb.compile_passes(backend="eager")  # lazy: nothing is traced before a call
        hart.compile_passes(backend="eager")
        emb.compile_passes(backend="eager")  # compiling again does not count twice
        assert config.cache_size_limit >= 256
        emb.disable_cuda_graphs()
        assert config.cache_size_limit >= 256  # the other pipeline still compiles its passes
        hart.disable_cuda_graphs()
        assert config.cache_size_limit == 8 and not emb.passes_compiled and not hart.passes_compiled
        hart.disable_cuda_graphs()  # already eager: nothing to give back
        assert config.cache_size_limit == 8
    finally:
        emb.disable_cuda_graphs()
        hart.disable_cuda_graphs()
        config.cache_size_limit = before


def test_sampling_modes_give_the_same_images(pipelines):
    for model in ("infinity", "hart"):
        pipe, kwargs = pipelines[model]
        assert pipe.sampling == "device"
        device = _generate(pipe, kwargs)
        pipe.set_sampling("official")
        try:
            assert pipe.sampling == "official"
            assert torch.equal(_generate(pipe, kwargs), device)
        finally:
            pipe.set_sampling("device")
    with pytest.raises(ValueError, match="sampling must be one of \\['device', 'official'\\], got 'cuda'"):
        pipe.set_sampling("cuda")
