"""The one executor: schedulers only decide (no token moves in ``schedulers/``), spans equal per-block routing, and a
nested route equals routing the composed selection."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from diffusers_var_accel import VARAccelScheduler
from diffusers_var_accel.next_scale.plan import PassRoutes, TokenRoute
from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline

pytestmark = pytest.mark.usefixtures("one_thread")
SCHEDULERS = Path(__file__).resolve().parents[2] / "diffusers_var_accel" / "schedulers"


def test_schedulers_move_no_tokens():
    """The methods compute decisions only: no gather, scatter, index_put or interpolate call in ``schedulers/``."""
    call = re.compile(r"\b\w*(scatter|index_put|interpolate|gather)\w*\s*\(")
    found = [
        f"{path.name}:{n}: {line.strip()}"
        for path in sorted(SCHEDULERS.glob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if call.search(line.split("#")[0])
    ]
    assert found == []


@pytest.fixture(scope="module")
def pipe():
    pipeline = build_tiny_infinity_pipeline(seed=0, depth=4)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


class _Fixed(VARAccelScheduler):
    """Routes the last scale with ``make(state, num_tokens)`` -> routes."""

    def __init__(self, make):
        super().__init__()
        self.make = make

    def route_pass(self, state, plan):
        if plan.scale_indices[0] != state.num_scales - 1:
            return None
        _, h, w = state.scale_schedule[-1]
        return PassRoutes(routes=self.make(state, h * w))


def _latents(pipe, scheduler=None):
    return pipe(
        "a fox",
        height=256,
        width=256,
        generator=torch.Generator().manual_seed(0),
        acceleration=scheduler,
        output_type="latent",
    ).images


def _kept(state, num_tokens):
    g = torch.Generator().manual_seed(1)
    return torch.stack(
        [torch.randperm(num_tokens, generator=g)[: num_tokens // 3].sort().values for _ in range(state.batch_size)]
    )


def test_a_span_equals_a_gather_and_scatter_per_block(pipe):
    depth = pipe.transformer.config.depth
    span = _Fixed(
        lambda state, n: dict.fromkeys([(l, "block") for l in range(depth)], TokenRoute(index=_kept(state, n)))
    )
    per_block = _Fixed(
        lambda state, n: {(l, "block"): TokenRoute(index=_kept(state, n).clone()) for l in range(depth)}
    )
    out = _latents(pipe, span)
    assert torch.equal(out, _latents(pipe, per_block))
    assert not torch.equal(out, _latents(pipe))


def test_a_nested_route_equals_its_composed_selection(pipe):
    """Keeping ``outer[inner]`` tokens of a pass-through route (inner route passing through too) is one route that
    keeps those tokens."""
    depth = pipe.transformer.config.depth

    def nested(state, n):
        outer = _kept(state, n)
        inner = torch.arange(0, outer.shape[1], 2).expand(state.batch_size, -1)
        return {(l, "block"): TokenRoute(index=inner).within(TokenRoute(index=outer)) for l in range(depth)}

    def direct(state, n):
        outer = _kept(state, n)
        return {(l, "block"): TokenRoute(index=outer[:, ::2].contiguous()) for l in range(depth)}

    assert torch.equal(_latents(pipe, _Fixed(nested)), _latents(pipe, _Fixed(direct)))


def test_for_layers_is_one_route_on_every_layer_and_none_computes_no_token(pipe):
    """``PassRoutes.for_layers`` gives the span of one shared route (the same images as the hand-made dict, and a
    route of every token gives the dense pass); ``TokenRoute.none`` on every block computes no token: the last
    scale's blocks pass their input through, and the image differs from the dense pass."""
    depth = pipe.transformer.config.depth
    shared = _Fixed(lambda state, n: PassRoutes.for_layers(TokenRoute(index=_kept(state, n)), range(depth)).routes)
    by_hand = _Fixed(
        lambda state, n: dict.fromkeys([(l, "block") for l in range(depth)], TokenRoute(index=_kept(state, n)))
    )
    assert torch.equal(_latents(pipe, shared), _latents(pipe, by_hand))
    routes = PassRoutes.for_layers(
        TokenRoute(index=torch.zeros(1, 2, dtype=torch.long)), [2, 0], "ffn", residual_tokens={3: 1}
    )
    assert list(routes.routes) == [(2, "ffn"), (0, "ffn")] and routes.routes[(2, "ffn")] is routes.routes[(0, "ffn")]
    assert routes.residual_tokens == {3: 1}
    with pytest.raises(
        ValueError, match="sublayer must be one of \\['block', 'self_attn', 'cross_attn', 'ffn'\\], got 'mlp'"
    ):
        PassRoutes.for_layers(TokenRoute(index=torch.zeros(1, 2, dtype=torch.long)), [0], "mlp")
    with pytest.raises(ValueError, match="layers must be integers >= 0, got -1"):
        PassRoutes.for_layers(TokenRoute(index=torch.zeros(1, 2, dtype=torch.long)), [0, -1])

    none = TokenRoute.none(2)
    assert none.index.shape == (2, 0) and none.index.dtype == torch.long
    with pytest.raises(ValueError, match="at least one row, got rows=0"):
        TokenRoute.none(0)
    nothing = _Fixed(lambda state, n: PassRoutes.for_layers(TokenRoute.none(state.batch_size), range(depth)).routes)
    empty = _Fixed(
        lambda state, n: {
            (l, "block"): TokenRoute(index=torch.zeros(state.batch_size, 0, dtype=torch.long)) for l in range(depth)
        }
    )
    assert torch.equal(_latents(pipe, nothing), _latents(pipe, empty))
    assert not torch.equal(_latents(pipe, nothing), _latents(pipe))
    every_token = _Fixed(
        lambda state, n: (
            PassRoutes.for_layers(TokenRoute(index=torch.arange(n).expand(state.batch_size, n)), range(depth)).routes
        )
    )
    assert torch.equal(_latents(pipe, every_token), _latents(pipe))


def test_a_route_takes_exactly_one_of_index_and_selector():
    with pytest.raises(ValueError, match="exactly one"):
        TokenRoute()
    with pytest.raises(ValueError, match="exactly one"):
        TokenRoute(index=torch.zeros(1, 1, dtype=torch.long), selector=lambda x: x)


def test_layer_routed_as_block_and_sublayer_is_refused(pipe):
    both = _Fixed(
        lambda state, n: {
            (0, "block"): TokenRoute(index=_kept(state, n)),
            (0, "ffn"): TokenRoute(index=_kept(state, n)),
        }
    )
    with pytest.raises(ValueError, match="layer 0 has a block route and sublayer routes"):
        _latents(pipe, both)


def test_a_routed_block_on_a_half_precision_stream_promotes_as_the_dense_path():
    """Under bf16 weights the stream enters block 0 in bf16 and leaves it in fp32 (the fp32 residual updates). A
    routed block scatters its tokens into a canvas of that promoted dtype, so routing every token of every block
    (a route per block, not a span) is bit for bit the dense pass; a canvas in the input's dtype rounded the
    computed tokens to bf16 at every layer."""
    from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline

    bf16 = build_tiny_infinity_pipeline(seed=0, depth=3, embed_dim=32, with_text_encoder=False)
    bf16 = bf16.to(dtype=torch.bfloat16)
    bf16.set_progress_bar_config(disable=True)
    depth = bf16.transformer.config.depth
    every = _Fixed(
        lambda state, n: {
            (l, "block"): TokenRoute(index=torch.arange(n).expand(state.batch_size, -1).clone()) for l in range(depth)
        }
    )
    embeds = torch.randn(1, 8, bf16.transformer.config.text_channels, generator=torch.Generator().manual_seed(2))

    def run(scheduler):
        return bf16(
            prompt_embeds=embeds,
            height=256,
            width=256,
            generator=torch.Generator().manual_seed(0),
            acceleration=scheduler,
            output_type="latent",
        ).images

    assert torch.equal(run(every), run(None))


def test_a_mixing_span_with_the_identity_projection_is_the_dense_pass(pipe):
    """A mixing route (StageVAR's) whose projection is the identity (r = N) and whose positions are the tokens in
    order runs the span on the tokens themselves, with their own RoPE positions: bit for bit the dense pass (the
    fp32 product by the identity is exact); its canvas is overwritten everywhere."""
    from diffusers_var_accel.next_scale.plan import EarlierScale, MixingRoute

    depth = pipe.transformer.config.depth

    class _Identity(VARAccelScheduler):
        def route_pass(self, state, plan):
            if plan.scale_indices[0] != state.num_scales - 1:
                return None
            _, h, w = state.scale_schedule[-1]

            def mixer(x):
                R, N, _ = x.shape
                return torch.arange(N).expand(R, N), torch.eye(N).expand(R, N, N)

            canvas = EarlierScale(torch.zeros(state.rows, 1, pipe.transformer.config.embed_dim), (1, 1))
            return PassRoutes(
                mixing={0: MixingRoute(depth // 2, mixer, canvas), depth // 2: MixingRoute(depth, mixer, canvas)}
            )

    assert torch.equal(_latents(pipe, _Identity()), _latents(pipe))


@pytest.mark.parametrize("family", ["infinity", "hart"])
def test_mixtures_at_their_drawn_positions_take_those_positions(pipes, family):
    """``rope_positions="drawn"`` (StageVAR's HART code): a projection that picks token ``perm[k]`` as the ``k``-th
    mixture, written back at ``perm[k]``, runs each token at its own position: the dense pass up to the order of the
    attention sums. At the first ``r`` positions (``"first"``, the Infinity code) the same tokens run at the wrong
    positions, and the image changes."""
    from diffusers_var_accel.next_scale.plan import EarlierScale, MixingRoute

    model = pipes(family)
    depth, width = model.transformer.config.depth, model.transformer.config.embed_dim

    class _Permuted(VARAccelScheduler):
        def __init__(self, rope_positions):
            super().__init__()
            self.rope_positions = rope_positions

        def route_pass(self, state, plan):
            if plan.scale_indices[0] != state.num_scales - 1:
                return None

            def mixer(x):
                R, N, _ = x.shape
                perm = torch.randperm(N, generator=torch.Generator().manual_seed(4))
                return perm.expand(R, N), torch.eye(N)[perm].T.expand(R, N, N)  # column k is one-hot at perm[k]

            canvas = EarlierScale(torch.zeros(state.rows, 1, width), (1, 1))
            return PassRoutes(mixing={0: MixingRoute(depth, mixer, canvas, rope_positions=self.rope_positions)})

    def run(scheduler):
        kwargs = {"height": 256, "width": 256} if family == "infinity" else {}
        return model(
            "a fox",
            generator=torch.Generator().manual_seed(0),
            acceleration=scheduler,
            guidance_scale=3.0,
            output_type="latent",
            **kwargs,
        ).images

    dense = run(None)
    # HART's latent passes the last scale's features through its diffusion head and soft codebook mixtures, which
    # amplify the summation-order rounding (docs/hart.md: ~1e-4); Infinity's codes do not
    tolerance = 1e-5 if family == "infinity" else 2e-4
    torch.testing.assert_close(run(_Permuted("drawn")), dense, atol=tolerance, rtol=tolerance)
    assert (run(_Permuted("first")) - dense).abs().max() > 100 * tolerance
    with pytest.raises(ValueError, match="rope_positions must be one of \\['first', 'drawn'\\], got 'last'"):
        MixingRoute(depth, lambda x: x, EarlierScale(torch.zeros(1, 1, width), (1, 1)), rope_positions="last")


def test_a_mixing_span_refuses_routes_inside_it(pipe):
    from diffusers_var_accel.next_scale.plan import EarlierScale, MixingRoute

    depth = pipe.transformer.config.depth

    def make(state, n):
        mixer = lambda x: (torch.arange(4).expand(x.shape[0], 4), torch.rand(x.shape[0], x.shape[1], 4))  # noqa: E731
        canvas = EarlierScale(torch.zeros(state.rows, 1, pipe.transformer.config.embed_dim), (1, 1))
        return {
            "mixing": {0: MixingRoute(depth, mixer, canvas)},
            "routes": {(1, "ffn"): TokenRoute(index=_kept(state, n))},
        }

    class _Both(VARAccelScheduler):
        def route_pass(self, state, plan):
            if plan.scale_indices[0] != state.num_scales - 1:
                return None
            _, h, w = state.scale_schedule[-1]
            return PassRoutes(**make(state, h * w))

    with pytest.raises(ValueError, match=r"layers \[1\] are in the mixing span 0..3"):
        _latents(pipe, _Both())


@pytest.mark.parametrize("per_row", [False, True], ids=["shared-table", "per-row-tables"])
def test_gathered_tokens_take_the_outer_pass_tables_bit_for_bit(per_row):
    """A context of gathered tokens (nested twice) gathers the outer pass's processed RoPE tables: the same values as
    processing the gathered raw table, for Infinity's shared table and HART's per-row tables, with one gather per
    token set and the outer tables built once per pass."""
    from diffusers_var_accel.models.attention_processor import HARTAttnProcessor, VARAttnProcessor
    from diffusers_var_accel.next_scale.context import VARForwardContext, gather_rope

    g = torch.Generator().manual_seed(0)
    R, L, d = 2, 12, 4
    raw = torch.randn(2, R if per_row else 1, 1, L, d, generator=g)
    processor = HARTAttnProcessor() if per_row else VARAttnProcessor()
    outer = VARForwardContext(kv_cache=None, rope_cos_sin=raw, call_cache={})
    index = torch.stack([torch.randperm(L, generator=g)[:7] for _ in range(R)])
    inner_index = torch.stack([torch.randperm(7, generator=g)[:3] for _ in range(R)])
    child = outer.for_tokens(index)
    grandchild = child.for_tokens(inner_index)
    assert child.rope_cos_sin is None and child.rope_source[0] is outer
    for context, positions in ((child, index), (grandchild, torch.gather(index, 1, inner_index))):
        got = processor._rope_tables(None, context, torch.float32)
        expected = processor.rope_tables(gather_rope(raw, positions), torch.float32)
        assert got.shape == expected.shape
        assert torch.equal(got, expected)
    tables = [v for k, v in outer.pass_cache.items() if k[0] == "rope_tables"]
    assert len(tables) == 1  # built once for the pass, then gathered
