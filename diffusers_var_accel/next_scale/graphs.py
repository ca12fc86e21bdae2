"""The speed machinery of the loop in one place: every transformer pass captured once as a graph and replayed by later
calls (:class:`PassGraphs`), or compiled (:class:`CompiledPassRunner`), and which of them a pipeline runs
(:class:`PassRunners`).

A pass of the next-scale loop has static shapes and no host sync, so it can be captured as it runs eagerly:
:class:`PassGraphs` is the loop's ``pass_runner`` under ``pipe.enable_cuda_graphs()``. Per *workspace* (one per scale
schedule, batch, CFG rows, model family, plan and scheduler configuration) it keeps

* the **KV cache**, allocated once (its buffers are written by the eager warm-up before the first capture, so they are
  never born inside a graph) and reset, not reallocated, at every call: the same addresses for every call. Workspaces
  whose caches have the same shape (layers, positions, rows) share one: a call resets it and writes every position
  before any pass reads it, so the baseline and a method with the baseline's plan (DepthVAR) need one cache, not two;
* per pass, the **captured graph** and its **static inputs**: the tensors of the first call that the pass read (the
  hidden states, the condition, RoPE tables, routes, fills, per-call constants, walked out of the pass's arguments in
  a fixed order); a later call copies its own tensors into them and replays. The walk of what stays the same for a
  whole call (the condition, the per-call constants) is done once per call;
* what the pass leaves behind besides its output (records for later scales, attention maps, per-call constants it
  computed, the cache's filled lengths), restored into the new call after the replay, as the eager pass would have
  left them. Record buffers that a pass writes whole (DepthVAR's stack of block deltas) are the workspace's, made by
  the eager warm-up as the KV cache is, so that a capture does not own them.

A pass whose inputs differ in structure from the captured one (another shape, another route layout) is captured
again, and so is every pass once the transformer's weights have moved (CPU offload, ``.to()``): graphs read weights by
address. A re-capture releases what the replaced graph held (its output, its effects, its static inputs), so
re-capturing does not grow a workspace. Capture modes:

* ``"cuda"``: ``torch.cuda.CUDAGraph`` (warm-up on a side stream, capture into the workspace's memory pool, replay).
* ``"trace"``: the CPU stand-in used by the tests: the pass traced once into an FX graph of ATen ops
  (``make_fx``) whose tensors are the same static inputs and cache buffers, replayed without running any Python of
  the pass, exactly as a CUDA graph replays; outputs are copied into the tensors captured at trace time, so addresses
  behave as under CUDA graphs. A tensor the pass read but the walk missed would be baked into the graph and go stale,
  which the tests' replay-against-eager comparison catches.

Both modes capture (and warm up) under :class:`~.capture_check.CaptureCheck`: a host sync, an upload, a random draw or
a device-less factory inside a pass raises there, naming the op and its line, instead of being traced into a graph
that would replay the first call's values. The VAE decode can be captured the same way (:meth:`PassGraphs.decode`).

This module imports nothing above the loop.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import types
import warnings
from collections import OrderedDict
from typing import Any, Callable, Dict, Hashable, List, Optional, Tuple

import torch

from .cache import ScaleKVCache
from .capture_check import CaptureCheck
from .plan import DRAWING_PASSES_WAY_OUT

CAPTURE_MODES = ("cuda", "trace")
#: context fields the pass writes (outputs), that start empty, or that are walked once per call: not walked per pass
_OUTPUT_FIELDS = frozenset({"kv_cache", "records", "attention_maps", "pass_cache", "call_cache", "decisions"})


def run_family_blocks(family, hidden_RLC: torch.Tensor, condition, context) -> torch.Tensor:
    """The transformer blocks of one pass: what a pass runner runs in place of the loop's ``family.run_blocks``
    call (``torch.compile(run_family_blocks)`` for compiled passes; captured once per pass for graphs)."""
    return family.run_blocks(hidden_RLC, condition, context)


class PassCaptureError(RuntimeError):
    """A pass (or decode) could not be captured; the message names the pass, its scales and the original cause."""


class _Walk:
    """The tensors an object graph holds, in a fixed order, and a hashable signature of everything else."""

    def __init__(self, owned: Dict[int, Tuple[int, int]], memo: Optional[Dict[Hashable, Tuple[Any, list]]] = None):
        self.tensors: List[torch.Tensor] = []
        self.signature: List[Hashable] = []
        self.owned = (
            owned  # id -> (capture serial, position) of tensors this workspace's graphs produced: left in place
        )
        self.memo = memo if memo is not None else {}
        self._seen: Dict[int, int] = {}

    def add_constant(self, obj: Any, version: Hashable) -> None:
        """Walk ``obj``, which stays the same for the whole call (while ``version`` does): once per call."""
        key = (id(obj), version)
        found = self.memo.get(key)
        if found is None:
            walk = _Walk(self.owned)
            walk.add(obj)
            found = self.memo[key] = (tuple(walk.signature), walk.tensors, obj)  # obj kept: its id stays valid
        self.signature.append(("constant", found[0]))
        self.tensors.extend(found[1])

    def add(self, obj: Any, depth: int = 0) -> None:
        sig = self.signature
        if depth > 12:
            raise RuntimeError("pass arguments nest too deeply to capture")
        if obj is None or isinstance(obj, (bool, int, float, str, bytes, torch.dtype, torch.device, torch.Size)):
            sig.append(obj)
            return
        if isinstance(obj, torch.Tensor):
            owned = self.owned.get(id(obj))
            if owned is not None:
                sig.append(("owned", owned))
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
    cache_filled: Tuple[Tuple[int, ...], Tuple[int, ...]]  # the KV cache's ScaleKVCache.filled()
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
        cache.filled(),
        context.records.block_delta_stack,
    )


def _restore_effects(effects: _Effects, context) -> None:
    for name, key, tensor in effects.records:
        getattr(context.records, name)[key] = tensor
    context.records.block_delta_stack = effects.delta_stack
    context.attention_maps.update(effects.attention_maps)
    if context.call_cache is not None:
        context.call_cache.update(effects.call_cache)
    context.kv_cache.restore_filled(effects.cache_filled)


def _uncached_autocast():
    """The CUDA autocast in force, without its weight-cast cache: a cast cached outside the capture would be freed
    when the caller's autocast region ends, under a graph that still reads it (PyTorch's rule for graph capture)."""
    if not torch.is_autocast_enabled("cuda"):
        return contextlib.nullcontext()
    torch.clear_autocast_cache()
    return torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"), cache_enabled=False)


def run_capture(graph, stream_context, body: Callable[[], Any], what: str, pool=None) -> Any:
    """``body()`` captured into ``graph`` (``capture_begin`` / ``capture_end``) on the stream of ``stream_context``.

    A failure inside the capture is reported with its own cause and ``what`` (the pass and its scales), not as the
    "operation failed due to a previous error during capture" that ``capture_end`` raises after it; the capture is
    ended and the thread leaves the capture stream whatever happened."""
    error: Optional[BaseException] = None
    output = None
    with stream_context:
        graph.capture_begin(pool=pool)
        try:
            with _uncached_autocast(), CaptureCheck(what):
                output = body()
        except BaseException as err:  # noqa: BLE001 - reported below, after the capture is closed
            error = err
        finally:
            try:
                graph.capture_end()
            except BaseException as end_error:  # noqa: BLE001 - the body's error, if any, is the cause to report
                if error is None:
                    error = end_error
    if error is not None:
        if isinstance(error, KeyboardInterrupt):
            raise error
        raise PassCaptureError(f"{what} failed: {type(error).__name__}: {error}") from error
    return output


@dataclasses.dataclass
class _PassGraph:
    signature: Tuple[Hashable, ...]
    signature_hash: int
    inputs: List[torch.Tensor]  # the static inputs: the first call's tensors, kept alive
    output: torch.Tensor
    effects: _Effects
    replay: Callable[[], None]
    serial: int  # which capture made it: owned tensors are named by (serial, position)

    def produced(self) -> List[torch.Tensor]:
        """The tensors the graph writes and later passes may read in place (its output and effects)."""
        return [self.output] + self.effects.tensors()


class _Workspace:
    def __init__(self, cache: ScaleKVCache):
        self.cache = cache
        self.graphs: Dict[int, _PassGraph] = {}
        self.owned: Dict[int, Tuple[int, int]] = {}  # id(tensor) -> (serial, position), for tensors its graphs made
        self.record_buffers: Dict[Hashable, torch.Tensor] = {}
        self.pool = None

    def put(self, index: int, graph: _PassGraph) -> None:
        """Make ``graph`` pass ``index``'s, releasing what the graph it replaces held."""
        old = self.graphs.pop(index, None)
        if old is not None:
            for tensor in old.produced():
                if self.owned.get(id(tensor), (None,))[0] == old.serial:
                    del self.owned[id(tensor)]
        self.graphs[index] = graph
        for position, tensor in enumerate(graph.produced()):
            self.owned.setdefault(id(tensor), (graph.serial, position))

    def record_buffer(self, index: int) -> Callable[..., torch.Tensor]:
        """The allocator of pass ``index``'s record buffers (``PassRecords.buffers``): one buffer per (pass, name,
        shape, dtype, device), made by the first (eager, warm-up) request, so that no graph owns it."""

        def allocate(name: str, shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
            key = (index, name, tuple(shape), dtype, device)
            buffer = self.record_buffers.get(key)
            if buffer is None:
                buffer = self.record_buffers[key] = torch.empty(tuple(shape), dtype=dtype, device=device)
            return buffer

        return allocate

    def nbytes(self) -> int:
        """Bytes of what the workspace holds besides the KV cache: graph outputs, effects, static inputs and record
        buffers (each storage once)."""
        seen, total = set(), 0
        tensors = list(self.record_buffers.values())
        for graph in self.graphs.values():
            tensors += graph.produced() + graph.inputs
        for t in tensors:
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        return total


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


class SharedKVCaches:
    """The KV caches of a pass runner's workspaces, one per shape ``(layers, positions, rows)``: workspaces whose
    caches have the same shape share it (a call resets it and writes every position before a pass reads it)."""

    def __init__(self):
        self._caches: Dict[Tuple[int, int, Hashable], ScaleKVCache] = {}

    def get(self, num_layers: int, max_length: int, rows: Hashable) -> ScaleKVCache:
        key = (num_layers, max_length, rows)
        cache = self._caches.get(key)
        if cache is None:
            cache = self._caches[key] = ScaleKVCache(num_layers, max_length=max_length)
        return cache

    def keep_only(self, used: List[ScaleKVCache]) -> None:
        """Drop the caches no workspace uses any more."""
        ids = {id(c) for c in used}
        self._caches = {k: c for k, c in self._caches.items() if id(c) in ids}

    def __len__(self) -> int:
        return len(self._caches)


class PassGraphs:
    """The pass runner of ``pipe.enable_cuda_graphs()``: capture each pass once, replay it in later calls.

    Args:
        mode (`str`, defaults to `"cuda"`): ``"cuda"`` (``torch.cuda.CUDAGraph``) or ``"trace"`` (the CPU stand-in:
            an FX graph replayed without the pass's Python; see the module docstring).
        max_workspaces (`int`, defaults to 4): workspaces (schedule x batch x plan x scheduler configuration) kept,
            least recently used dropped; each holds its graphs (its KV cache is shared with workspaces of the same
            cache shape).

    Attributes:
        captured_passes (`int`): passes captured so far; ``replayed_passes`` (`int`): passes replayed so far;
        captured_decodes / replayed_decodes (`int`): the same for :meth:`decode`.
    """

    def __init__(self, mode: str = "cuda", max_workspaces: int = 4):
        if mode not in CAPTURE_MODES:
            raise ValueError(f"mode must be one of {list(CAPTURE_MODES)}, got {mode!r}")
        if isinstance(max_workspaces, bool) or not isinstance(max_workspaces, int) or max_workspaces < 1:
            raise ValueError(f"max_workspaces must be a positive integer, got {max_workspaces!r}")
        self.mode, self.max_workspaces = mode, max_workspaces
        #: whether the pipeline decodes through :meth:`decode` (``enable_cuda_graphs(decode=...)``)
        self.capture_decode = True
        self.workspaces: "OrderedDict[Hashable, _Workspace]" = OrderedDict()
        self.kv_caches = SharedKVCaches()
        self.captured_passes = self.replayed_passes = 0
        self.captured_decodes = self.replayed_decodes = 0
        self._decodes: Dict[Hashable, Tuple[torch.Tensor, torch.Tensor, Callable[[], None]]] = {}
        self._current: Optional[_Workspace] = None
        self._pass_index = 0
        self._serial = 0
        self._weights: Tuple[int, ...] = ()
        self._memo: Dict[Hashable, Tuple[Any, list]] = {}  # walks of what stays the same for the call
        self._stream = None

    # -- the loop's hooks ---------------------------------------------------------------------------------------------
    def kv_cache(self, key: Hashable, num_layers: int, max_length: int, rows: Hashable = None) -> ScaleKVCache:
        """The KV cache of a call whose schedule, batch, rows, family, plan and scheduler configuration make ``key``:
        its workspace's, reset (same buffers as the last call of that key, shared with the workspaces whose cache
        has the same ``(num_layers, max_length, rows)``)."""
        key = (key, num_layers, max_length)
        workspace = self.workspaces.get(key)
        if workspace is None:
            workspace = self.workspaces[key] = _Workspace(self.kv_caches.get(num_layers, max_length, rows))
            while len(self.workspaces) > self.max_workspaces:
                self.workspaces.popitem(last=False)
            self.kv_caches.keep_only([w.cache for w in self.workspaces.values()])
        self.workspaces.move_to_end(key)
        workspace.cache.reset()
        self._current, self._pass_index = workspace, 0
        self._memo = {}
        return workspace.cache

    def __call__(self, family, hidden_RLC: torch.Tensor, condition, context) -> torch.Tensor:
        refuse_drawing_passes(context, "enable_cuda_graphs()")
        workspace = self._current
        if workspace is None or context.kv_cache is not workspace.cache:
            raise RuntimeError(
                "PassGraphs runs passes of a call whose KV cache it made (the loop asks kv_cache() first)"
            )
        context.static_pass = True  # nothing in a captured pass may read the device on the host
        index, self._pass_index = self._pass_index, self._pass_index + 1
        cache = context.kv_cache
        if index == 0:  # where the weights live, once per call: a graph reads them by address (offloading moves them)
            transformer = getattr(family, "transformer", None)
            self._weights = () if transformer is None else tuple(p.data_ptr() for p in transformer.parameters())
        walk = _Walk(workspace.owned, self._memo)
        # the family's own per-call state is not walked: ``run_blocks`` reads the call's tensors from its arguments only
        # (the ScaleModelFamily contract); its transformer's weights are the graph's constants
        walk.add((type(family).__qualname__, hidden_RLC))
        walk.add_constant(condition, None)
        if context.call_cache is not None:  # per-call constants: only ever added to, so its size versions it
            walk.add_constant(context.call_cache, len(context.call_cache))
        walk.add(context)
        signature = (tuple(walk.signature), cache.stores, cache.filled()[0], self._weights)
        signature_hash = hash(signature)
        graph = workspace.graphs.get(index)
        if graph is not None and graph.signature_hash == signature_hash and graph.signature == signature:
            for static, new in zip(graph.inputs, walk.tensors):
                if new is not static and new.data_ptr() != static.data_ptr():
                    static.copy_(new)
            graph.replay()
            _restore_effects(graph.effects, context)
            self.replayed_passes += 1
            return graph.output

        def body(ctx=context):
            return run_family_blocks(family, hidden_RLC, condition, ctx)

        what = f"capturing pass {index} (scales {[f'{h}x{w}' for h, w in context.scale_hws]})"
        graph = self._capture(workspace, index, body, context, signature, signature_hash, walk.tensors, what)
        workspace.put(index, graph)
        self._memo = {}  # owned tensors changed: what the walks named owned may have moved
        self.captured_passes += 1
        return graph.output

    # -- the VAE decode -----------------------------------------------------------------------------------------------
    def decode(self, vae: torch.nn.Module, latents: torch.Tensor) -> torch.Tensor:
        """``vae.decode(latents)``, captured once per latent shape (and VAE weights, tiling and slicing settings) and
        replayed; returns a new tensor (the graph's output is copied out: a caller may keep its image)."""
        weights = tuple(p.data_ptr() for p in vae.parameters())
        options = tuple(getattr(vae, name, None) for name in ("use_tiling", "use_slicing"))
        key = (id(vae), tuple(latents.shape), latents.dtype, latents.device, weights, options)
        found = self._decodes.get(key)
        if found is None:
            static = latents.clone()
            what = f"capturing the decode of a {tuple(latents.shape)} latent"
            with CaptureCheck(what) if self.mode == "trace" else contextlib.nullcontext():
                vae.decode(static)  # warm-up, eager (outside the capture: kernels initialise, nothing is owned)
            if self.mode == "trace":
                from torch.fx.experimental.proxy_tensor import make_fx

                with CaptureCheck(what):
                    module = make_fx(lambda z: vae.decode(z))(static)
                output = module(static)

                @torch.no_grad()
                def replay(module=module, static=static, output=output):
                    output.copy_(module(static))

            else:
                graph = torch.cuda.CUDAGraph()
                torch.cuda.synchronize()
                output = run_capture(
                    graph, torch.cuda.stream(self._capture_stream()), lambda: vae.decode(static), what
                )
                graph.replay()
                replay = torch.no_grad()(graph.replay)
            self._decodes = {k: v for k, v in self._decodes.items() if k[0] != id(vae) or k[4] == weights}
            found = self._decodes[key] = (static, output, replay)
            self.captured_decodes += 1
        else:
            found[0].copy_(latents)
            found[2]()
            self.replayed_decodes += 1
        return found[1].clone()

    # -- capture ------------------------------------------------------------------------------------------------------
    def _capture_stream(self):
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        return self._stream

    def _capture(
        self, workspace: _Workspace, index: int, body, context, signature, signature_hash, inputs, what: str
    ) -> _PassGraph:
        cache, call_cache = context.kv_cache, context.call_cache if context.call_cache is not None else {}
        before = set(call_cache)
        filled = cache.filled()
        context.records.buffers = workspace.record_buffer(index)
        # warm-up, eager (cuBLAS / cuDNN initialise outside the capture; the first cache writes allocate its buffers
        # and the first record writes the workspace's record buffers here, so that no graph owns them), on a copy of
        # the context: what it computes and keeps (per-call and per-pass constants, records) must be computed again
        # inside the capture, not read from the warm-up
        warm = dataclasses.replace(
            context,
            records=type(context.records)(buffers=context.records.buffers),
            attention_maps={},
            pass_cache={},
            call_cache=None if context.call_cache is None else dict(call_cache),
        )
        if self.mode == "cuda":
            stream = self._capture_stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream), _uncached_autocast(), CaptureCheck(what + " (warm-up)"):
                body(warm)
            torch.cuda.current_stream().wait_stream(stream)
        else:
            body(warm)
        cache.restore_filled(filled)  # the cache buffers stay: rewritten below
        self._serial += 1
        if self.mode == "trace":
            return self._capture_trace(body, context, signature, signature_hash, inputs, before, what)
        if workspace.pool is None:
            workspace.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        output = run_capture(graph, torch.cuda.stream(self._capture_stream()), body, what, pool=workspace.pool)
        graph.replay()  # the capture recorded the kernels without running them
        return _PassGraph(
            signature,
            signature_hash,
            list(inputs),
            output,
            _collect_effects(context, before),
            torch.no_grad()(graph.replay),
            self._serial,
        )

    def _capture_trace(self, body, context, signature, signature_hash, inputs, before, what: str) -> _PassGraph:
        from torch.fx.experimental.proxy_tensor import make_fx

        captured: Dict[str, Any] = {}

        def traced():
            with CaptureCheck(what):
                output = body()
            effects = _collect_effects(context, before)
            captured["output"], captured["effects"] = output, effects
            return (output, *effects.tensors())

        try:
            module = make_fx(traced)()  # runs the pass for real (values are this call's) while recording its ATen ops
        except Exception as err:
            raise PassCaptureError(f"{what} failed: {type(err).__name__}: {err}") from err
        targets = [captured["output"], *captured["effects"].tensors()]

        @torch.no_grad()
        def replay():
            for target, value in zip(targets, module()):
                if value is not target:
                    target.copy_(value)

        return _PassGraph(
            signature, signature_hash, list(inputs), captured["output"], captured["effects"], replay, self._serial
        )

    # -- what the workspaces hold -------------------------------------------------------------------------------------
    def owned_tensors(self) -> int:
        """Tensors the workspaces' graphs produced and keep (outputs and effects): constant across calls of a plan."""
        return sum(len(w.owned) for w in self.workspaces.values())

    def nbytes(self) -> int:
        """Bytes the runner holds: the shared KV caches, and each workspace's graphs and record buffers."""
        caches = {id(w.cache): w.cache for w in self.workspaces.values()}
        return sum(c.nbytes for c in caches.values()) + sum(w.nbytes() for w in self.workspaces.values())


# =====================================================================================================================
# compiled passes: torch.compile of the blocks of each pass, dynamo's cache limits raised (and hitting them an error),
# the CUDA-graph skips counted and reported instead of hidden
# =====================================================================================================================
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


# =====================================================================================================================
# which runner a pipeline's passes go through
# =====================================================================================================================
class PassRunners:
    """A pipeline's pass runner (``None``: eager; :class:`PassGraphs`; :class:`CompiledPassRunner`) and the
    process-wide settings that come with compiling (dynamo's raised cache limits, inductor's strict graphs), set and
    given back together. The pipeline mixin's ``enable_cuda_graphs`` / ``compile_passes`` /
    ``compile_repeated_blocks`` / ``disable_cuda_graphs`` are its front."""

    def __init__(self):
        self.runner: Optional[Callable] = None
        self._limits_raised = False
        self._strict_saved: Optional[bool] = None

    def compile(self, transformer, backend, fullgraph: bool, mode: Optional[str], options: Dict[str, Any]) -> None:
        """Compile every pass with ``torch.compile`` (one static graph per pass)."""
        if not self._limits_raised:
            self.reset(transformer)  # captured graphs and compiled regions (if any) are dropped
            raise_graph_cache_limits()
            self._limits_raised = True
        options = {"dynamic": False, **options}  # one static graph per pass: shapes never depend on the data
        compiled = torch.compile(run_family_blocks, backend=backend, fullgraph=fullgraph, mode=mode, **options)
        self.runner = CompiledPassRunner(compiled, cuda_graphs=mode in ("reduce-overhead", "max-autotune"))

    def compile_regions(self, transformer, backend, fullgraph: bool, mode: Optional[str], options: Dict[str, Any]):
        """Regional compilation of ``transformer``'s repeated blocks (its ``compile_repeated_blocks``)."""
        if not self._limits_raised:
            raise_graph_cache_limits()
            self._limits_raised = True
        transformer.compile_repeated_blocks(
            backend=backend, fullgraph=fullgraph, mode=mode, **{"dynamic": False, **options}
        )

    def capture(self, mode: str, max_workspaces: int, decode: bool) -> None:
        """Capture every pass (:class:`PassGraphs` in ``mode``), the VAE decode too with ``decode``."""
        self.reset(None)
        self.runner = PassGraphs(mode, max_workspaces)
        self.runner.capture_decode = decode

    def strict(self) -> None:
        """Raise at the first pass CUDA-graph trees skip (inductor's ``triton.cudagraph_or_error``, until reset)."""
        import torch._inductor.config as inductor_config

        self._strict_saved = inductor_config.triton.cudagraph_or_error
        inductor_config.triton.cudagraph_or_error = True

    def reset(self, transformer) -> None:
        """Eager passes again: the runner dropped, the process-wide settings given back (dynamo's limits once no
        pipeline compiles its passes), ``transformer``'s compiled regions undone."""
        if self._strict_saved is not None:
            import torch._inductor.config as inductor_config

            inductor_config.triton.cudagraph_or_error = self._strict_saved
            self._strict_saved = None
        if self._limits_raised:
            restore_graph_cache_limits()
            self._limits_raised = False
        self.runner = None
        if transformer is not None:
            for module in transformer.modules():  # regions of compile_repeated_blocks
                if getattr(module, "_compiled_call_impl", None) is not None:
                    module._compiled_call_impl = None

    @property
    def graphs(self) -> Optional[PassGraphs]:
        """The :class:`PassGraphs` replaying captured passes, or ``None``."""
        return self.runner if isinstance(self.runner, PassGraphs) else None

    @property
    def skipped_passes(self) -> int:
        """Passes compiled with CUDA graphs that CUDA-graph trees skipped (0 for the other runners)."""
        return self.runner.skipped_passes if isinstance(self.runner, CompiledPassRunner) else 0
