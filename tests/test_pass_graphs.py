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


def test_a_pass_whose_inputs_change_shape_is_captured_again(pipes):
    """Same plan (LazyVAR's group), other keep ratios: the group's pass takes other shapes and is captured again;
    the other passes replay. Both settings equal eager."""
    pipe, family = pipes("infinity"), "infinity"
    first, second = preset("lazyvar", family), preset("lazyvar", family, keep_ratios=(0.5, 0.4, 0.3, 0.2))
    schedule = pipe.scale_schedule_for(*INFINITY_SIZES[0])[0]
    assert first.plan_scales(schedule) == second.plan_scales(schedule)
    eager = [images(pipe, family, s) for s in (first, second)]
    pipe.enable_cuda_graphs(capture="trace")
    try:
        graphs = pipe.pass_graphs
        assert torch.equal(images(pipe, family, first), eager[0])
        captured = graphs.captured_passes
        assert torch.equal(images(pipe, family, second), eager[1])
        assert graphs.captured_passes == captured + 1 and len(graphs.workspaces) == 1
        assert torch.equal(images(pipe, family, first), eager[0])  # captured again: back to the first shapes
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
