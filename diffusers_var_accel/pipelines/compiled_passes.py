"""Compiled passes: ``torch.compile`` of the blocks of each pass with dynamo's cache limits raised (and hitting them
an error), the CUDA-graph skips counted and reported instead of hidden."""

from __future__ import annotations

import collections
import warnings
from typing import Any, Callable, Dict


from ..next_scale.cache import ScaleKVCache
from ..next_scale.graphs import SharedKVCaches

#: The dynamo cache size limit ``compile_passes`` sets at least (each pass of each plan is one cached graph).
PASS_GRAPH_CACHE_LIMIT = 256


#: dynamo's process-wide cache limits before the first pipeline compiled its passes, and how many pipelines do now
_GRAPH_CACHE_STATE: Dict[str, Any] = {"pipelines": 0, "saved": None}
_GRAPH_CACHE_LIMITS = (
    ("cache_size_limit", PASS_GRAPH_CACHE_LIMIT),
    ("accumulated_cache_size_limit", 4 * PASS_GRAPH_CACHE_LIMIT),
)


def raise_graph_cache_limits() -> None:
    """Raise dynamo's cache limits above the graphs of a few plans (one graph per pass), remembering the old values,
    and make hitting them an error: past the limit dynamo would otherwise run the pass eagerly without a word."""
    import torch._dynamo

    config = torch._dynamo.config
    if _GRAPH_CACHE_STATE["pipelines"] == 0:
        _GRAPH_CACHE_STATE["saved"] = {
            name: getattr(config, name) for name, _ in _GRAPH_CACHE_LIMITS if hasattr(config, name)
        }
        if hasattr(config, "fail_on_recompile_limit_hit"):
            _GRAPH_CACHE_STATE["saved"]["fail_on_recompile_limit_hit"] = config.fail_on_recompile_limit_hit
    _GRAPH_CACHE_STATE["pipelines"] += 1
    for name, limit in _GRAPH_CACHE_LIMITS:
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), limit))
    if hasattr(config, "fail_on_recompile_limit_hit"):
        config.fail_on_recompile_limit_hit = True


def cudagraph_skips() -> int:
    """How many times torch.compile's CUDA-graph trees have run a graph without capturing or replaying it (a skip:
    mutated inputs, CPU tensors, dynamic shapes...) in this process."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"].get("cudagraph_skips", 0))


class CompiledPassRunner:
    """The ``pass_runner`` of a pipeline whose passes are compiled: runs ``torch.compile(run_family_blocks)`` and
    reports, instead of hiding, the passes that ran without CUDA graphs when graphs were asked for.

    The KV cache lives here, one per (schedule, batch, rows, family, plan, scheduler configuration), as in
    :class:`~diffusers_var_accel.next_scale.graphs.PassGraphs`: the loop asks :meth:`kv_cache` for it, and a call with
    the same key gets the same buffers back (reset), so compiled passes and their CUDA graphs see the same addresses
    call after call. The buffers are allocated by the first pass of a call (the start token alone: the smallest
    pass), which therefore runs **eagerly** in every call, never inside a graph (CUDA-graph trees would own buffers
    born there and skip every later pass that writes them for "mutated inputs"); they are then marked static
    addresses (``torch._dynamo.mark_static_address``) for the compiled passes.

    Attributes:
        skipped_passes (`int`): passes run so far for which CUDA-graph trees reported a skip (only counted when
            graphs are on).
        eager_first_passes (`int`): first passes run eagerly (one per call).
    """

    def __init__(self, compiled: Callable, cuda_graphs: bool, max_workspaces: int = 4):
        self.compiled, self.cuda_graphs = compiled, cuda_graphs
        self.max_workspaces = max_workspaces
        self.skipped_passes = self.eager_first_passes = 0
        self._warned = False
        self._caches: "collections.OrderedDict[Any, ScaleKVCache]" = collections.OrderedDict()
        self._shared = SharedKVCaches()

    def kv_cache(self, key, num_layers: int, max_length: int, rows=None) -> ScaleKVCache:
        """The KV cache of a call whose schedule, batch, rows, family, plan and scheduler configuration make ``key``:
        the one of the last call with that key, reset (its buffers kept), or a new one (the least recently used key
        beyond ``max_workspaces`` is dropped). Keys whose caches have the same ``(num_layers, max_length, rows)``
        share one (a call writes every position before a pass reads it)."""
        key = (key, num_layers, max_length)
        cache = self._caches.get(key)
        if cache is None:
            cache = self._caches[key] = self._shared.get(num_layers, max_length, rows)
            while len(self._caches) > self.max_workspaces:
                self._caches.popitem(last=False)
            self._shared.keep_only(list(self._caches.values()))
        self._caches.move_to_end(key)
        cache.reset()
        return cache

    def __call__(self, family, hidden_RLC, condition, context):
        import torch._dynamo

        from ..next_scale.graphs import refuse_drawing_passes
        from ..next_scale.loop import run_family_blocks

        refuse_drawing_passes(context, "compile_passes()")
        context.static_pass = True  # nothing in a compiled pass may read the device on the host
        cache = context.kv_cache
        if cache is not None and cache.preallocated and cache.empty and cache.stores:
            allocated = cache.allocated
            out = run_family_blocks(family, hidden_RLC, condition, context)  # allocates the buffers, outside graphs
            self.eager_first_passes += 1
            if not allocated:
                for buffer in cache.buffers():
                    torch._dynamo.mark_static_address(buffer, guard=False)
            return out
        before = cudagraph_skips() if self.cuda_graphs else 0
        out = self.compiled(family, hidden_RLC, condition, context)
        if self.cuda_graphs and cudagraph_skips() > before:
            self.skipped_passes += 1
            if not self._warned:
                self._warned = True
                warnings.warn(
                    "enable_cuda_graphs(): CUDA-graph trees skipped a pass, which then ran without graphs (its "
                    "time is not a graph replay's); TORCH_LOGS=cudagraphs prints why, and "
                    "enable_cuda_graphs(strict=True) raises at the first skip. pipe.passes_without_graphs counts "
                    "them",
                    UserWarning,
                    stacklevel=2,
                )
        return out


def restore_graph_cache_limits() -> None:
    """Give dynamo back its cache limits when the last pipeline with compiled passes goes back to eager."""
    import torch._dynamo

    _GRAPH_CACHE_STATE["pipelines"] = max(_GRAPH_CACHE_STATE["pipelines"] - 1, 0)
    if _GRAPH_CACHE_STATE["pipelines"] == 0 and _GRAPH_CACHE_STATE["saved"] is not None:
        for name, value in _GRAPH_CACHE_STATE["saved"].items():
            setattr(torch._dynamo.config, name, value)
        _GRAPH_CACHE_STATE["saved"] = None
