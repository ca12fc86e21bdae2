"""Captured passes (``pipe.enable_cuda_graphs()``), checked on the CPU with their stand-in ``capture="trace"``.

A traced pass replays an FX graph of ATen ops whose tensors are the first call's inputs and the workspace's KV cache,
with none of the pass's Python, exactly as a CUDA graph replays its kernels on fixed addresses. So these tests check
what a CUDA graph would need: every input a pass reads is found and refreshed before a replay (a later call with other
prompts and seeds equals eager bit for bit), what a pass leaves behind is restored, the KV cache and the static
inputs keep their addresses within a call and across calls of the same plan, and a replayed pass run twice on the
same buffers gives the same output. Every method on both families.
"""

from __future__ import annotations

import pytest
import torch

from diffusers_var_accel.next_scale.graphs import PassGraphs

from test_method_conformance import CASES, INFINITY_SIZES, PROMPTS, gen, images, preset

FAMILY_CASES = [(None, "infinity"), (None, "hart")] + CASES
#: A method whose preset draws random numbers inside its passes (``draws_inside_passes``: StageVAR's token mixtures) is
#: refused under capture; what of it can be captured is replayed instead (StageVAR: its guidance and skip rules).
CAPTURABLE_OVERRIDES = {"stagevar": dict(projected_scales=(), rank_ratios=())}


def _calls(pipe, family, scheduler):
    """Three calls: A, then B (other prompts and seeds), then A again."""
    a = dict(prompt=PROMPTS, generator=[gen(1), gen(2)])
    b = dict(prompt=PROMPTS[::-1], generator=[gen(3), gen(4)])
    return [images(pipe, family, scheduler, **kw) for kw in (a, b, a)]


@pytest.mark.parametrize("method, family", FAMILY_CASES, ids=[f"{m or 'baseline'}-{f}" for m, f in FAMILY_CASES])
def test_replayed_passes_equal_eager_for_other_inputs(method, family, pipes):
    pipe = pipes(family)
    scheduler = None if method is None else preset(method, family)
    if scheduler is not None and scheduler.draws_inside_passes:
        assert pipe.enable_cuda_graphs(capture="trace") is True
        try:
            with pytest.raises(ValueError, match="draws random numbers inside its passes"):
                images(pipe, family, scheduler)
        finally:
            pipe.disable_cuda_graphs()
        scheduler = preset(method, family, **CAPTURABLE_OVERRIDES[method])
        assert not scheduler.draws_inside_passes
    eager = _calls(pipe, family, scheduler)
    assert not torch.equal(eager[0], eager[1])
    assert pipe.enable_cuda_graphs(capture="trace") is True
    try:
        graphs = pipe.pass_graphs
        captured = _calls(pipe, family, scheduler)
        passes = len(next(iter(graphs.workspaces.values())).graphs)
        assert graphs.captured_passes == passes > 0  # every pass captured once, in the first call
        assert graphs.replayed_passes == 2 * passes  # and replayed by both later calls
        for got, want in zip(captured, eager):
            assert torch.equal(got, want)
    finally:
        pipe.disable_cuda_graphs()
    assert pipe.pass_graphs is None and not pipe.passes_compiled


@pytest.mark.parametrize("family", ["infinity", "hart"])
def test_buffers_keep_their_addresses_and_a_replay_twice_gives_the_same_output(family, pipes):
    pipe = pipes(family)
    scheduler = preset("lazyvar", family)
    seen = []
    pipe.enable_cuda_graphs(capture="trace")
    graphs = pipe.pass_graphs
    original = PassGraphs.__call__

    def spy(self, family_, hidden, condition, context):
        cache = context.kv_cache
        seen.append((id(cache), [t.data_ptr() for t in cache._key_buffers + cache._value_buffers if t is not None]))
        return original(self, family_, hidden, condition, context)

    try:
        PassGraphs.__call__ = spy
        _calls(pipe, family, scheduler)
    finally:
        PassGraphs.__call__ = original
    try:
        (workspace,) = graphs.workspaces.values()
        # one cache object for every pass of every call; its buffers, once allocated (by pass 0's eager warm-up),
        # never move
        assert len({cache for cache, _ in seen}) == 1
        full = [ptrs for _, ptrs in seen if ptrs]
        assert full and all(ptrs == full[0] for ptrs in full) and len(seen) > len(workspace.graphs)
        inputs_before = {i: [t.data_ptr() for t in g.inputs] for i, g in workspace.graphs.items()}
        images(pipe, family, scheduler, prompt=PROMPTS, generator=[gen(5), gen(6)])
        assert {i: [t.data_ptr() for t in g.inputs] for i, g in workspace.graphs.items()} == inputs_before
        for graph in workspace.graphs.values():  # the same static buffers twice: the same output
            graph.replay()
            first = graph.output.clone()
            graph.replay()
            assert torch.equal(graph.output, first)
    finally:
        pipe.disable_cuda_graphs()


def test_a_pass_whose_inputs_change_shape_is_captured_again(pipes, monkeypatch):
    """Same plan (LazyVAR's group), other keep ratios, under a key that cannot tell them apart: the group's pass takes
    other shapes and is captured again; the other passes replay. Both settings equal eager."""
    from diffusers_var_accel import LazyVARScheduler

    pipe, family = pipes("infinity"), "infinity"
    first, second = preset("lazyvar", family), preset("lazyvar", family, keep_ratios=(0.5, 0.4, 0.3, 0.2))
    schedule = pipe.scale_schedule_for(*INFINITY_SIZES[0])[0]
    assert first.plan_scales(schedule) == second.plan_scales(schedule)
    eager = [images(pipe, family, s) for s in (first, second)]
    monkeypatch.setattr(LazyVARScheduler, "workspace_key", property(lambda self: ("one key",)))
    pipe.enable_cuda_graphs(capture="trace")
    try:
        graphs = pipe.pass_graphs
        assert torch.equal(images(pipe, family, first), eager[0])
        captured, owned = graphs.captured_passes, graphs.owned_tensors()
        assert torch.equal(images(pipe, family, second), eager[1])
        assert graphs.captured_passes == captured + 1 and len(graphs.workspaces) == 1
        assert torch.equal(images(pipe, family, first), eager[0])  # captured again: back to the first shapes
        assert graphs.captured_passes == captured + 2
        assert graphs.owned_tensors() == owned  # the replaced graphs' outputs were released, not kept
    finally:
        pipe.disable_cuda_graphs()


def test_settings_of_one_plan_get_their_own_workspaces_and_replay(pipes):
    """Two LazyVAR settings with the same plan (and a scheduler built anew per call from the same settings) each
    keep their graphs: alternating them captures nothing after the first round."""
    pipe, family = pipes("infinity"), "infinity"
    first, second = preset("lazyvar", family), preset("lazyvar", family, keep_ratios=(0.5, 0.4, 0.3, 0.2))
    eager = [images(pipe, family, s) for s in (first, second)]
    pipe.enable_cuda_graphs(capture="trace")
    try:
        graphs = pipe.pass_graphs
        for s in (first, second):
            images(pipe, family, s)
        captured = graphs.captured_passes
        for _ in range(2):
            assert torch.equal(images(pipe, family, preset("lazyvar", family)), eager[0])  # a new, equal scheduler
            assert torch.equal(images(pipe, family, second), eager[1])
        assert graphs.captured_passes == captured and len(graphs.workspaces) == 2
        # the two plans are equal, so their KV caches have one shape: one cache serves both workspaces
        assert len(graphs.kv_caches) == 1 and len({id(w.cache) for w in graphs.workspaces.values()}) == 1
    finally:
        pipe.disable_cuda_graphs()


def test_each_plan_has_its_workspace_and_old_ones_are_dropped(pipes):
    pipe, family = pipes("infinity"), "infinity"
    pipe.enable_cuda_graphs(capture="trace", max_workspaces=2)
    try:
        graphs = pipe.pass_graphs
        for method in (None, "lazyvar", "fastvar"):
            images(pipe, family, None if method is None else preset(method, family))
        assert len(graphs.workspaces) == 2  # the baseline's was dropped (least recently used)
        caches = {id(w.cache) for w in graphs.workspaces.values()}
        assert len(caches) == 2
    finally:
        pipe.disable_cuda_graphs()


def test_bad_settings_and_cuda_off_cuda(pipes):
    pipe = pipes("hart")
    with pytest.raises(ValueError, match="capture must be 'cuda', 'compile' or 'trace', got 'fx'"):
        pipe.enable_cuda_graphs(capture="fx")
    with pytest.raises(ValueError, match="max_workspaces must be a positive integer, got 0"):
        pipe.enable_cuda_graphs(capture="trace", max_workspaces=0)
    with pytest.warns(UserWarning, match="does nothing on the cpu device"):
        assert pipe.enable_cuda_graphs() is False
    assert not pipe.passes_compiled
    with pytest.raises(ValueError, match="mode must be one of"):
        PassGraphs("graph")


def test_every_registered_method_is_replayed_here():
    """The conformance cases cover every registered method, so a new method is checked under capture too."""
    from diffusers_var_accel.schedulers.registry import method_names

    assert {m for m, _ in CASES} == set(method_names()) >= {"fastvar", "lazyvar", "depthvar", "arvar"}


def test_moved_weights_are_captured_again(pipes):
    """Graphs read the weights by address: after the weights move (offloading, ``.to()``), every pass is captured
    again instead of replaying on freed memory, and the images still equal eager."""
    pipe, family = pipes("hart"), "hart"
    eager = images(pipe, family, None)
    pipe.enable_cuda_graphs(capture="trace")
    try:
        graphs = pipe.pass_graphs
        images(pipe, family, None)
        captured = graphs.captured_passes
        pipe.transformer.to(torch.float64).to(torch.float32)  # the same values in new storage
        assert torch.equal(images(pipe, family, None), eager)
        assert graphs.captured_passes == 2 * captured
        assert torch.equal(images(pipe, family, None), eager) and graphs.captured_passes == 2 * captured
    finally:
        pipe.disable_cuda_graphs()


@pytest.fixture(scope="module")
def real_schedule_pipes():
    """Tiny-width pipelines on the real schedules: Infinity at 1024x1024 (13 scales), HART on HART-0.7B's 14."""
    from diffusers_var_accel.models.transformer_hart import HART_CONFIGS
    from diffusers_var_accel.pipelines.hart.tiny import build_tiny_hart_pipeline
    from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline

    built = {}

    def get(family):
        if family not in built:
            if family == "infinity":
                pipe = build_tiny_infinity_pipeline(seed=0, depth=2, embed_dim=32)
            else:
                pipe = build_tiny_hart_pipeline(
                    seed=0,
                    depth=2,
                    embed_dim=32,
                    patch_nums=HART_CONFIGS["hart-0.7b"]["patch_nums"],
                    tokenizer_ch_mult=(1,),
                )
            pipe.set_progress_bar_config(disable=True)
            built[family] = pipe
        return built[family]

    return get


#: Prompts of one token length (a text of another length changes the condition's shape: its passes are new captures).
SAME_LENGTH_PROMPTS = ["a red fox", "two white cats"]


def _latent(pipe, family, scheduler, seed):
    size = {"height": 1024, "width": 1024} if family == "infinity" else {}
    return pipe(
        SAME_LENGTH_PROMPTS[seed % 2], generator=gen(seed), acceleration=scheduler, output_type="latent", **size
    ).images


@pytest.mark.parametrize(
    "family, methods", [("infinity", ["baseline", "depthvar"]), ("hart", ["baseline", "fastvar", "depthvar"])]
)
def test_interleaved_methods_of_one_plan_capture_once_and_hold_their_memory(family, methods, real_schedule_pipes):
    """The runner's interleaved rounds on the real schedules: methods whose plans equal the baseline's (DepthVAR on
    Infinity; FastVAR and DepthVAR on HART) have their own workspaces, so the second round replays every pass and
    captures nothing, and what the workspaces hold (tensors and bytes) does not grow from round to round."""
    from diffusers_var_accel.next_scale.loop import identity_plans
    from diffusers_var_accel.schedulers.specs import load_acceleration

    pipe = real_schedule_pipes(family)
    schedulers = {m: None if m == "baseline" else load_acceleration(m, family) for m in methods}
    schedule = pipe.scale_schedule_for(1024, 1024)[0] if family == "infinity" else None
    if schedule is not None:  # the case the workspace key must tell apart: equal plans, other routes
        assert schedulers["depthvar"].plan_scales(schedule) == identity_plans(schedule)
    eager = {m: _latent(pipe, family, s, 7) for m, s in schedulers.items()}
    pipe.enable_cuda_graphs(capture="trace", max_workspaces=len(methods))
    try:
        graphs = pipe.pass_graphs
        for m, s in schedulers.items():  # round 1: captures
            _latent(pipe, family, s, 1)
        captured, owned, held = graphs.captured_passes, graphs.owned_tensors(), graphs.nbytes()
        for round_seed in (2, 7):
            replayed = graphs.replayed_passes
            for m, s in schedulers.items():
                latent = _latent(pipe, family, s, round_seed)
                if round_seed == 7:
                    assert torch.equal(latent, eager[m]), m
            assert graphs.captured_passes == captured  # nothing captured in a timed round
            assert graphs.replayed_passes > replayed
            assert graphs.owned_tensors() == owned and graphs.nbytes() == held
        assert len(graphs.workspaces) == len(methods)
    finally:
        pipe.disable_cuda_graphs()


def test_a_planted_host_read_inside_a_pass_fails_the_capture_naming_op_and_line(pipes, monkeypatch):
    """A capture runs under the capture check: a ``.item()`` inside a pass raises while the pass is captured,
    naming the op, the planted line and the pass, instead of being traced in with the first call's value."""
    import inspect

    from diffusers_var_accel.next_scale import graphs
    from diffusers_var_accel.next_scale.graphs import PassCaptureError

    pipe, family = pipes("infinity"), "infinity"
    original = graphs.run_family_blocks

    def planted(family_, hidden, condition, context):
        out = original(family_, hidden, condition, context)
        if out.abs().max().item() < 0:  # planted: a host read of a device value
            return -out
        return out

    line = inspect.getsourcelines(planted)[1] + 2
    monkeypatch.setattr(graphs, "run_family_blocks", planted)
    images(pipe, family)  # eagerly the planted read is allowed
    pipe.enable_cuda_graphs(capture="trace")
    try:
        with pytest.raises(PassCaptureError) as raised:
            images(pipe, family)
    finally:
        pipe.disable_cuda_graphs()
    message = str(raised.value)
    assert "capturing pass 0 (scales ['1x1'])" in message
    assert "aten._local_scalar_dense is a host sync" in message
    assert f"test_pass_graphs.py:{line} (planted)" in message


@pytest.mark.parametrize(
    "planted, op",
    [
        (lambda x: x.tolist(), "Tensor.tolist()"),
        (lambda x: x.nonzero(), "aten.nonzero"),
        (lambda x: x + torch.tensor([1.0, 2.0, 3.0], device=x.device), "aten.lift_fresh"),
        (lambda x: x + torch.randn(3, generator=torch.Generator().manual_seed(0), device=x.device), "aten.randn"),
        (lambda x: x + torch.arange(3), "torch.arange(...) without device="),
        (lambda x: x.repeat_interleave(torch.ones(3, dtype=torch.long, device=x.device)), "aten.repeat_interleave"),
    ],
    ids=["tolist", "nonzero", "upload", "draw", "deviceless", "repeat_interleave"],
)
def test_capture_check_refuses_what_a_graph_cannot_hold(planted, op):
    from diffusers_var_accel.next_scale.capture_check import CaptureCheck, CaptureIllegalError

    x = torch.ones(3)
    with pytest.raises(CaptureIllegalError, match=op.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        with CaptureCheck("a test"):
            planted(x)
    with CaptureCheck("a test"):  # what a pass does is allowed: device-side work on tensors with named devices
        y = torch.zeros(3, device=x.device) + x * 2
        y.repeat_interleave(2)
        torch.empty(3, device=x.device).copy_(y)


def test_a_grouped_pass_with_unknown_counts_taken_scale_by_scale_is_refused_when_captured(pipes, monkeypatch):
    """The one host read left on a reachable path (per-scale attention of routed tokens without counts) is refused
    under a pass runner with a clear error instead of aborting a CUDA capture."""
    from diffusers_var_accel.models.attention_processor import VARAttnProcessor
    from diffusers_var_accel.next_scale.context import VARForwardContext

    processor = VARAttnProcessor()
    processor.grouped_attention = "per_scale"
    attn = pipes("infinity").transformer.blocks[0].sa
    # routed tokens: their count per scale unknown (no scale sizes to read it from)
    context = VARForwardContext(kv_cache=None, rope_cos_sin=None, static_pass=True)
    hidden = torch.randn(2, 5, attn.num_heads * attn.head_dim)
    rope = torch.ones(2, 1, 1, 5, attn.head_dim // 2)
    with pytest.raises(ValueError, match="reading the scale ids on the host.*captured or compiled pass"):
        processor(
            attn, hidden, context, rope_cos_sin=rope, scale_ids=torch.tensor([0, 1, 1, 1, 1]).view(1, 5).expand(2, 5)
        )
    context.static_pass = False  # eagerly the same call runs, scale by scale
    assert (
        processor(
            attn, hidden, context, rope_cos_sin=rope, scale_ids=torch.tensor([0, 1, 1, 1, 1]).view(1, 5).expand(2, 5)
        ).shape
        == hidden.shape
    )


def test_a_failed_cuda_capture_reports_its_cause_and_leaves_the_capture_stream():
    """``capture_end`` after a failure raises "operation failed due to a previous error during capture"; the error
    reported is the original one with the pass named, the capture is ended and the stream context left."""
    from diffusers_var_accel.next_scale.graphs import PassCaptureError, run_capture

    events = []

    class Graph:
        def capture_begin(self, pool=None):
            events.append("begin")

        def capture_end(self):
            events.append("end")
            raise RuntimeError("operation failed due to a previous error during capture")

    class Stream:
        def __enter__(self):
            events.append("enter stream")

        def __exit__(self, *exc):
            events.append("leave stream")

    def body():
        raise ValueError("keys of 3 heads do not fit the cache")

    with pytest.raises(
        PassCaptureError, match=r"capturing pass 3 \(scales \['4x4'\]\) failed: ValueError: keys of 3"
    ) as raised:
        run_capture(Graph(), Stream(), body, "capturing pass 3 (scales ['4x4'])")
    assert isinstance(raised.value.__cause__, ValueError)
    assert events == ["enter stream", "begin", "end", "leave stream"]
