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
from diffusers_var_accel.pipelines.hart.tiny import build_tiny_hart_pipeline
from registry_lists import capturable_in_every_family

#: The baseline and every method whose presets can be compiled in every family (a pass that draws random numbers
#: inside it, StageVAR's projection, cannot be: the pass runners refuse it).
METHODS = ["baseline", *capturable_in_every_family()]


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

        counting_runner.kv_cache = compiled_runner.kv_cache  # the runner's KV workspaces (fixed addresses)
        pipe._pass_runner = counting_runner
        counters.clear()
        first = _generate(pipe, kwargs)
        graphs = counters["stats"]["unique_graphs"]
        # one graph per pass but the first (run eagerly: it allocates the KV buffers outside any graph), none split
        # (fullgraph would raise anyway)
        assert passes and graphs == len(passes) - 1 and compiled_runner.eager_first_passes == 1
        assert not counters["graph_break"]
        assert torch.equal(first, eager)
        buffers = [b.data_ptr() for b in compiled_runner._caches[next(iter(compiled_runner._caches))].buffers()]
        passes.clear()
        second = _generate(pipe, kwargs)
        assert len(passes) == graphs + 1 and compiled_runner.eager_first_passes == 2
        assert counters["stats"]["unique_graphs"] == graphs  # nothing recompiled on the second call
        assert torch.equal(second, eager)
        cache = compiled_runner._caches[next(iter(compiled_runner._caches))]
        assert [b.data_ptr() for b in cache.buffers()] == buffers  # the same KV buffers, call after call
        assert all(getattr(b, "_dynamo_static_input_type", None) == "unguarded" for b in cache.buffers())
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


def test_passes_past_the_recompile_limit_raise_instead_of_running_eagerly(pipelines, monkeypatch):
    """Dynamo runs a frame eagerly, silently, past its recompile limit; compiled passes make that an error (reproduced
    with the limit lowered so that the embedded model's passes exceed it), and eager gives the setting back."""
    from diffusers_var_accel.next_scale import graphs as compiled_passes

    config = torch._dynamo.config
    pipe, kwargs = pipelines["hart"]
    saved = config.cache_size_limit, config.fail_on_recompile_limit_hit  # dynamo's config: not monkeypatch-able
    monkeypatch.setattr(compiled_passes, "_GRAPH_CACHE_LIMITS", (("cache_size_limit", 2),))
    try:
        config.cache_size_limit, config.fail_on_recompile_limit_hit = 1, False
        pipe.compile_passes(backend="eager")
        try:
            assert config.fail_on_recompile_limit_hit is True
            with pytest.raises(Exception, match="(?i)recompile|cache.?size|limit"):
                _generate(pipe, kwargs)  # 14 passes of distinct shapes through one code object: 2 graphs allowed
        finally:
            pipe.disable_cuda_graphs()
        assert config.fail_on_recompile_limit_hit is False and config.cache_size_limit == 1
    finally:
        config.cache_size_limit, config.fail_on_recompile_limit_hit = saved


def test_a_pass_skipped_by_cuda_graph_trees_warns_once_and_is_counted(pipelines):
    """Under graphs, a pass that CUDA-graph trees skip runs without replay: the pipeline says so once and counts it
    (simulated on the CPU: the compiled pass reports a skip the way inductor does)."""
    from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter

    from diffusers_var_accel.next_scale.graphs import run_family_blocks
    from diffusers_var_accel.next_scale.graphs import CompiledPassRunner

    pipe, kwargs = pipelines["hart"]
    calls = []

    def skipping_pass(family, hidden, condition, context):
        calls.append(1)
        if len(calls) % 2:  # every other pass "skipped"
            log_cudagraph_skip_and_bump_counter("skipping cudagraphs due to mutated inputs (simulated)")
        return run_family_blocks(family, hidden, condition, context)

    eager = _generate(pipe, kwargs)
    pipe._pass_runner = CompiledPassRunner(skipping_pass, cuda_graphs=True)
    try:
        with pytest.warns(UserWarning, match="skipped a pass") as seen:
            first = _generate(pipe, kwargs)
        assert len([w for w in seen if "skipped a pass" in str(w.message)]) == 1
        skipped = pipe.passes_without_graphs
        assert skipped == (len(calls) + 1) // 2 > 0
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # said once per pipeline
            _generate(pipe, kwargs)
        assert pipe.passes_without_graphs > skipped
        assert torch.equal(first, eager)
    finally:
        pipe._pass_runner = None
    assert pipe.passes_without_graphs == 0
    with pytest.raises(ValueError, match="strict must be True or False"):
        pipe.enable_cuda_graphs(strict="yes")


def test_lazyvar_with_depthvar_compiles_on_the_mask_free_attention_path(pipelines, monkeypatch):
    """LazyVAR+DepthVAR with one mask-free attention call per scale (flash, cuDNN, ``grouped_attention="per_scale"``):
    the nested depth routes carry their per-scale token counts, so no pass reads the scale ids on the host and every
    pass compiles as one graph with ``fullgraph=True``, equal to eager."""
    from diffusers_var_accel.models.attention_processor import VARAttnProcessor

    monkeypatch.setattr(VARAttnProcessor, "grouped_attention", "per_scale")
    pipe, kwargs = pipelines["infinity"]
    pipe.enable_acceleration("lazyvar+depthvar")
    try:
        eager = _generate(pipe, kwargs)
        pipe.compile_passes(backend="eager", fullgraph=True)
        counters.clear()
        compiled = _generate(pipe, kwargs)
        assert not counters["graph_break"]
        assert torch.equal(compiled, eager)
    finally:
        pipe.disable_cuda_graphs()
        pipe.disable_acceleration()


@pytest.mark.parametrize("model", ["infinity", "hart"])
def test_regional_compilation_compiles_each_token_count_once_for_every_block(pipelines, model):
    """``compile_repeated_blocks()`` (diffusers' regional compilation): the feed-forward networks are compiled once
    per input shape, one graph shared by every block (not a graph per block or per pass), give the eager result,
    and a second call compiles nothing; ``disable_cuda_graphs()`` gives the eager modules back."""
    pipe, kwargs = pipelines[model]
    regions = [m for m in pipe.transformer.modules() if type(m).__name__ in pipe.transformer._repeated_blocks]
    assert len(regions) == len(pipe.transformer.blocks)
    shapes = set()
    hooks = [m.register_forward_pre_hook(lambda m, args: shapes.add(tuple(args[0].shape))) for m in regions]
    try:
        eager = _generate(pipe, kwargs)
    finally:
        for hook in hooks:
            hook.remove()
    try:
        pipe.compile_repeated_blocks(backend="eager")
        assert pipe.compiled_regions == len(regions)
        counters.clear()
        first = _generate(pipe, kwargs)
        assert counters["stats"]["unique_graphs"] == len(shapes)  # one per token count, whatever the depth
        assert torch.equal(first, eager)
        second = _generate(pipe, kwargs)
        assert counters["stats"]["unique_graphs"] == len(shapes) and torch.equal(second, eager)
    finally:
        pipe.disable_cuda_graphs()
    assert pipe.compiled_regions == 0
