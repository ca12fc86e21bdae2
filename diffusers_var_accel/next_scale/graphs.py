"""Every transformer pass captured once as a graph and replayed by later calls, with no compiler in the way.

A pass of the next-scale loop has static shapes and no host sync, so it can be captured as it runs eagerly:
:class:`PassGraphs` is the loop's ``pass_runner`` under ``pipe.enable_cuda_graphs()``. Per *workspace* (one per scale
schedule, batch, CFG rows, model family and plan) it keeps

* the **KV cache**, allocated once (its buffers are written by the eager warm-up before the first capture, so they are
  never born inside a graph) and reset, not reallocated, at every call: the same addresses for every call;
* per pass, the **captured graph** and its **static inputs**: the tensors of the first call that the pass read (the
  hidden states, the condition, RoPE tables, routes, fills, per-call constants, walked out of the pass's arguments in
  a fixed order); a later call copies its own tensors into them and replays;
* what the pass leaves behind besides its output (records for later scales, attention maps, per-call constants it
  computed, the cache's filled lengths), restored into the new call after the replay, as the eager pass would have
  left them.

A pass whose inputs differ in structure from the captured one (another shape, another route layout) is captured
again, and so is every pass once the transformer's weights have moved (CPU offload, ``.to()``): graphs read weights by
address. Capture modes:

* ``"cuda"``: ``torch.cuda.CUDAGraph`` (warm-up on a side stream, capture into the workspace's memory pool, replay).
* ``"trace"``: the CPU stand-in used by the tests: the pass traced once into an FX graph of ATen ops
  (``make_fx``) whose tensors are the same static inputs and cache buffers, replayed without running any Python of
  the pass, exactly as a CUDA graph replays; outputs are copied into the tensors captured at trace time, so addresses
  behave as under CUDA graphs. A tensor the pass read but the walk missed would be baked into the graph and go stale,
  which the tests' replay-against-eager comparison catches.

This module imports nothing above the loop.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections import OrderedDict
from typing import Any, Callable, Dict, Hashable, List, Optional, Tuple

import torch

from .cache import ScaleKVCache
from .plan import DRAWING_PASSES_WAY_OUT

CAPTURE_MODES = ("cuda", "trace")
#: context fields the pass writes (outputs) or that start empty: not inputs
_OUTPUT_FIELDS = frozenset({"kv_cache", "records", "attention_maps", "pass_cache"})


class _Walk:
    """The tensors an object graph holds, in a fixed order, and a hashable signature of everything else."""

    def __init__(self, owned: Dict[int, int]):
        self.tensors: List[torch.Tensor] = []
        self.signature: List[Hashable] = []
        self.owned = owned  # id -> index of tensors the workspace's graphs produced (not inputs: left in place)
        self._seen: Dict[int, int] = {}

    def add(self, obj: Any, depth: int = 0) -> None:
        sig = self.signature
        if depth > 12:
            raise RuntimeError("pass arguments nest too deeply to capture")
        if obj is None or isinstance(obj, (bool, int, float, str, bytes, torch.dtype, torch.device, torch.Size)):
            sig.append(obj)
            return
        if isinstance(obj, torch.Tensor):
            if id(obj) in self.owned:
                sig.append(("owned", self.owned[id(obj)]))
                return
            if isinstance(obj, torch.nn.Parameter):
                sig.append(("parameter", id(obj)))
                return
            sig.append(("tensor", tuple(obj.shape), obj.dtype, obj.device))
            self.tensors.append(obj)
            return
        if isinstance(obj, (torch.nn.Module, ScaleKVCache, type, types.ModuleType, torch.Generator)):
            sig.append(("object", type(obj).__name__, id(obj) if isinstance(obj, torch.nn.Module) else 0))
            return
        if id(obj) in self._seen:  # shared or cyclic references: one visit, a back-reference in the signature
            sig.append(("same", self._seen[id(obj)]))
            return
        self._seen[id(obj)] = len(self._seen)
        if isinstance(obj, (list, tuple)):
            sig.append((type(obj).__name__, len(obj)))
            for item in obj:
                self.add(item, depth + 1)
        elif isinstance(obj, (set, frozenset)):
            sig.append((type(obj).__name__, tuple(sorted(map(repr, obj)))))
        elif isinstance(obj, dict):
            keys = sorted(obj, key=repr)
            sig.append(("dict", tuple(map(repr, keys))))
            for key in keys:
                self.add(obj[key], depth + 1)
        elif dataclasses.is_dataclass(obj):
            sig.append(("dataclass", type(obj).__name__))
            for f in dataclasses.fields(obj):
                if f.name not in _OUTPUT_FIELDS:
                    self.add(getattr(obj, f.name), depth + 1)
        elif isinstance(obj, functools.partial):
            sig.append(("partial",))
            self.add(obj.func, depth + 1)
            self.add(obj.args, depth + 1)
            self.add(obj.keywords, depth + 1)
        elif isinstance(obj, types.MethodType):
            sig.append(("method", obj.__func__.__qualname__))
            self.add(obj.__self__, depth + 1)
        elif isinstance(obj, types.FunctionType):  # a selector closure: the tensors it closes over are inputs too
            sig.append(("function", obj.__qualname__))
            for cell in obj.__closure__ or ():
                self.add(cell.cell_contents, depth + 1)
            self.add(obj.__defaults__, depth + 1)
        elif hasattr(obj, "__dict__"):
            sig.append(("object", type(obj).__qualname__))
            self.add(dict(vars(obj)), depth + 1)
        else:
            sig.append(("value", repr(obj)))


@dataclasses.dataclass
class _Effects:
    """What one pass leaves in its context besides the output."""

    records: List[Tuple[str, Hashable, torch.Tensor]]
    attention_maps: Dict[int, torch.Tensor]
    call_cache: Dict[Hashable, Any]
    cache_lengths: List[int]
    cache_attended: List[int]
    delta_stack: Optional[torch.Tensor] = (
        None  # the records' one buffer of block deltas (PassRecords.block_delta_stack)
    )

    def tensors(self) -> List[torch.Tensor]:
        out = [t for _, _, t in self.records] + list(self.attention_maps.values())
        if self.delta_stack is not None:
            out.append(self.delta_stack)
        for value in self.call_cache.values():
            out.extend(_tensors_of(value))
        return out


def _tensors_of(value) -> List[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors_of(item)]
    return []


def _collect_effects(context, call_cache_before: set) -> _Effects:
    records = []
    for f in dataclasses.fields(context.records):
        entries = getattr(context.records, f.name)
        if isinstance(entries, dict):
            records.extend((f.name, key, tensor) for key, tensor in entries.items())
    call_cache = context.call_cache or {}
    new_entries = {k: v for k, v in call_cache.items() if k not in call_cache_before}
    cache = context.kv_cache
    return _Effects(
        records,
        dict(context.attention_maps),
        new_entries,
        list(cache._lengths),
        list(cache._attended),
        context.records.block_delta_stack,
    )


def _restore_effects(effects: _Effects, context) -> None:
    for name, key, tensor in effects.records:
        getattr(context.records, name)[key] = tensor
    context.records.block_delta_stack = effects.delta_stack
    context.attention_maps.update(effects.attention_maps)
    if context.call_cache is not None:
        context.call_cache.update(effects.call_cache)
    context.kv_cache._lengths = list(effects.cache_lengths)
    context.kv_cache._attended = list(effects.cache_attended)


def _uncached_autocast():
    """The CUDA autocast in force, without its weight-cast cache: a cast cached outside the capture would be freed
    when the caller's autocast region ends, under a graph that still reads it (PyTorch's rule for graph capture)."""
    import contextlib

    if not torch.is_autocast_enabled("cuda"):
        return contextlib.nullcontext()
    torch.clear_autocast_cache()
    return torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"), cache_enabled=False)


@dataclasses.dataclass
class _PassGraph:
    signature: Tuple[Hashable, ...]
    inputs: List[torch.Tensor]  # the static inputs: the first call's tensors, kept alive
    output: torch.Tensor
    effects: _Effects
    replay: Callable[[], None]


class _Workspace:
    def __init__(self, cache: ScaleKVCache):
        self.cache = cache
        self.graphs: Dict[int, _PassGraph] = {}
        self.owned: Dict[int, int] = {}  # id(tensor) -> stable index, for tensors produced by this workspace's graphs
        self._owned_refs: List[torch.Tensor] = []
        self.pool = None

    def own(self, tensors: List[torch.Tensor]) -> None:
        for t in tensors:
            if id(t) not in self.owned:
                self.owned[id(t)] = len(self._owned_refs)
                self._owned_refs.append(t)  # keeps the id valid while the workspace lives


def refuse_drawing_passes(context, runner: str) -> None:
    """Raise for a pass whose routes draw random numbers inside it (a mixing span's mixer), which a captured or
    compiled pass cannot hold: the graph would replay one draw, or break on the generators. Named in the error
    rather than run eagerly, so that a measured graph run is a graph run."""
    routes = context.routes
    if routes is not None and routes.mixing:
        raise ValueError(
            f"{runner}: this pass runs layers {sorted(routes.mixing)} on random token mixtures drawn inside "
            f"the pass from the call's generators, {DRAWING_PASSES_WAY_OUT}"
        )


class PassGraphs:
    """The pass runner of ``pipe.enable_cuda_graphs()``: capture each pass once, replay it in later calls.

    Args:
        mode (`str`, defaults to `"cuda"`): ``"cuda"`` (``torch.cuda.CUDAGraph``) or ``"trace"`` (the CPU stand-in:
            an FX graph replayed without the pass's Python; see the module docstring).
        max_workspaces (`int`, defaults to 4): workspaces (schedule x batch x plan) kept, least recently used
            dropped; each holds its KV cache and graphs.

    Attributes:
        captured_passes (`int`): passes captured so far; ``replayed_passes`` (`int`): passes replayed so far.
    """

    def __init__(self, mode: str = "cuda", max_workspaces: int = 4):
        if mode not in CAPTURE_MODES:
            raise ValueError(f"mode must be one of {list(CAPTURE_MODES)}, got {mode!r}")
        if isinstance(max_workspaces, bool) or not isinstance(max_workspaces, int) or max_workspaces < 1:
            raise ValueError(f"max_workspaces must be a positive integer, got {max_workspaces!r}")
        self.mode, self.max_workspaces = mode, max_workspaces
        self.workspaces: "OrderedDict[Hashable, _Workspace]" = OrderedDict()
        self.captured_passes = self.replayed_passes = 0
        self._current: Optional[_Workspace] = None
        self._pass_index = 0
        self._weights: Tuple[int, ...] = ()

    # -- the loop's hooks ---------------------------------------------------------------------------------------------
    def kv_cache(self, key: Hashable, num_layers: int, max_length: int) -> ScaleKVCache:
        """The KV cache of a call whose schedule, batch, rows, family and plan make ``key``: the workspace's, reset
        (same buffers as the last call of that key)."""
        key = (key, num_layers, max_length)
        workspace = self.workspaces.get(key)
        if workspace is None:
            workspace = self.workspaces[key] = _Workspace(ScaleKVCache(num_layers, max_length=max_length))
            while len(self.workspaces) > self.max_workspaces:
                self.workspaces.popitem(last=False)
        self.workspaces.move_to_end(key)
        workspace.cache.reset()
        self._current, self._pass_index = workspace, 0
        return workspace.cache

    def __call__(self, family, hidden_RLC: torch.Tensor, condition, context) -> torch.Tensor:
        from .loop import run_family_blocks

        refuse_drawing_passes(context, "enable_cuda_graphs()")
        workspace = self._current
        if workspace is None or context.kv_cache is not workspace.cache:
            raise RuntimeError(
                "PassGraphs runs passes of a call whose KV cache it made (the loop asks kv_cache() first)"
            )
        index, self._pass_index = self._pass_index, self._pass_index + 1
        walk = _Walk(workspace.owned)
        # the family's own per-call state is not walked: ``run_blocks`` reads the call's tensors from its arguments only
        # (the ScaleModelFamily contract); its transformer's weights are the graph's constants
        walk.add((type(family).__qualname__, hidden_RLC, condition, context))
        cache = context.kv_cache
        if index == 0:  # where the weights live, once per call: a graph reads them by address (offloading moves them)
            transformer = getattr(family, "transformer", None)
            self._weights = () if transformer is None else tuple(p.data_ptr() for p in transformer.parameters())
        signature = (tuple(walk.signature), cache.stores, tuple(cache._lengths), self._weights)
        graph = workspace.graphs.get(index)
        if graph is not None and graph.signature == signature:
            for static, new in zip(graph.inputs, walk.tensors):
                if new is not static and new.data_ptr() != static.data_ptr():
                    static.copy_(new)
            graph.replay()
            _restore_effects(graph.effects, context)
            self.replayed_passes += 1
            return graph.output

        def body(ctx=context):
            return run_family_blocks(family, hidden_RLC, condition, ctx)

        graph = self._capture(workspace, body, context, signature, walk.tensors)
        workspace.graphs[index] = graph
        workspace.own([graph.output] + graph.effects.tensors())
        self.captured_passes += 1
        return graph.output

    # -- capture ------------------------------------------------------------------------------------------------------
    def _capture(self, workspace: _Workspace, body, context, signature, inputs) -> _PassGraph:
        cache, call_cache = context.kv_cache, context.call_cache if context.call_cache is not None else {}
        before = set(call_cache)
        lengths, attended = list(cache._lengths), list(cache._attended)
        # warm-up, eager (cuBLAS / cuDNN initialise outside the capture; the first cache writes allocate its buffers
        # here, so that no graph owns them), on a copy of the context: what it computes and keeps (per-call and
        # per-pass constants, records) must be computed again inside the capture, not read from the warm-up
        warm = dataclasses.replace(
            context,
            records=type(context.records)(),
            attention_maps={},
            pass_cache={},
            call_cache=None if context.call_cache is None else dict(call_cache),
        )
        if self.mode == "cuda":
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream), _uncached_autocast():
                body(warm)
            torch.cuda.current_stream().wait_stream(stream)
        else:
            body(warm)
        cache._lengths, cache._attended = list(lengths), list(attended)  # the cache buffers stay: rewritten below
        if self.mode == "trace":
            return self._capture_trace(body, context, signature, inputs, before)
        if workspace.pool is None:
            workspace.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with _uncached_autocast(), torch.cuda.graph(graph, pool=workspace.pool):
            output = body()
        graph.replay()  # the capture recorded the kernels without running them
        return _PassGraph(
            signature, list(inputs), output, _collect_effects(context, before), torch.no_grad()(graph.replay)
        )

    def _capture_trace(self, body, context, signature, inputs, before) -> _PassGraph:
        from torch.fx.experimental.proxy_tensor import make_fx

        captured: Dict[str, Any] = {}

        def traced():
            output = body()
            effects = _collect_effects(context, before)
            captured["output"], captured["effects"] = output, effects
            return (output, *effects.tensors())

        module = make_fx(traced)()  # runs the pass for real (values are this call's) while recording its ATen ops
        targets = [captured["output"], *captured["effects"].tensors()]

        @torch.no_grad()
        def replay():
            for target, value in zip(targets, module()):
                target.copy_(value)

        return _PassGraph(signature, list(inputs), captured["output"], captured["effects"], replay)
