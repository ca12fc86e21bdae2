"""The attention kernel is chosen the diffusers way, and grouped passes keep their block-causal structure on any backend.

``transformer.set_attention_backend(name)`` and ``with attention_backend(name):`` both reach diffusers'
``dispatch_attention_fn``; with neither, the processors pass ``backend=None`` so the registry's active backend runs.
A grouped pass (LazyVAR's group of scales in one forward) uses one mask-free call per scale on backends that take no
boolean mask; those calls equal the masked call within float rounding.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry, attention_backend

from diffusers_var_accel import HART_CONFIGS, LazyVARScheduler
from diffusers_var_accel.models import attention_processor
from diffusers_var_accel.models.attention_processor import VARAttnProcessor
from diffusers_var_accel.next_scale.context import block_causal_mask
from diffusers_var_accel.pipelines.hart.tiny import build_tiny_hart_pipeline
from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline


@pytest.fixture(scope="module")
def infinity():
    pipe = build_tiny_infinity_pipeline(seed=0)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def hart():
    pipe = build_tiny_hart_pipeline(
        seed=0, depth=2, embed_dim=32, patch_nums=HART_CONFIGS["hart-0.7b"]["patch_nums"][:8], tokenizer_ch_mult=(1,)
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _image(pipe, acceleration=None):
    size = {"height": 256, "width": 256} if "Infinity" in type(pipe).__name__ else {}
    return pipe(
        "a red fox",
        generator=torch.Generator().manual_seed(0),
        output_type="pt",
        acceleration=acceleration,
        guidance_scale=3.0,
        **size,
    ).images


def _lazyvar(pipe):
    return LazyVARScheduler.from_preset("hart" if "HART" in type(pipe).__name__ else "infinity")


@pytest.fixture(autouse=True)
def registry_backend_restored():
    """``ModelMixin.set_attention_backend`` also sets diffusers' process-wide active backend, and
    ``reset_attention_backend`` leaves it set: give later tests the backend they started with."""
    before = _AttentionBackendRegistry._active_backend
    yield
    _AttentionBackendRegistry._active_backend = before


@pytest.fixture
def dispatch_calls(monkeypatch):
    """Every (backend argument, mask given) the processors hand to ``dispatch_attention_fn``."""
    calls = []
    real = attention_processor.dispatch_attention_fn

    def spy(*args, backend=None, **kwargs):
        calls.append((backend, kwargs.get("attn_mask") is not None))
        return real(*args, backend=backend, **kwargs)

    monkeypatch.setattr(attention_processor, "dispatch_attention_fn", spy)
    return calls


@pytest.fixture
def math_kernel_calls(monkeypatch):
    """Counts the calls that reach the registered ``_native_math`` kernel itself."""
    calls = []
    name = AttentionBackendName._NATIVE_MATH
    real = _AttentionBackendRegistry._backends[name]

    def counted(*args, **kwargs):
        calls.append(kwargs.get("attn_mask") is not None)
        return real(*args, **kwargs)

    monkeypatch.setitem(_AttentionBackendRegistry._backends, name, counted)
    return calls


@pytest.mark.parametrize("family", ["infinity", "hart"])
def test_without_a_choice_the_registry_decides(family, request, dispatch_calls):
    pipe = request.getfixturevalue(family)
    _image(pipe)
    assert dispatch_calls and all(backend is None for backend, _ in dispatch_calls)


@pytest.mark.parametrize("family", ["infinity", "hart"])
def test_the_context_manager_chooses_the_kernel(family, request, math_kernel_calls):
    pipe = request.getfixturevalue(family)
    default = _image(pipe, _lazyvar(pipe))
    assert not math_kernel_calls  # SDPA ("native") ran
    with attention_backend("_native_math"):
        math = _image(pipe, _lazyvar(pipe))
    assert math_kernel_calls and any(math_kernel_calls)  # the grouped pass kept its mask on the math kernel
    torch.testing.assert_close(math, default, atol=1e-4, rtol=1e-4)  # fp32 rounding through the decoder


@pytest.mark.parametrize("family", ["infinity", "hart"])
def test_set_attention_backend_on_the_model_chooses_the_kernel(family, request, dispatch_calls, math_kernel_calls):
    pipe = request.getfixturevalue(family)
    default = _image(pipe)
    before = _AttentionBackendRegistry._active_backend
    pipe.transformer.set_attention_backend("_native_math")
    try:
        dispatch_calls.clear()
        math = _image(pipe)
    finally:
        pipe.transformer.reset_attention_backend()
        # diffusers' set_attention_backend also makes the backend the process-wide active one, and its reset leaves
        # that in place; the processors' own choice is what reset clears (checked below)
        _AttentionBackendRegistry._active_backend = before
    assert dispatch_calls and all(backend == AttentionBackendName._NATIVE_MATH for backend, _ in dispatch_calls)
    assert math_kernel_calls
    torch.testing.assert_close(math, default, atol=1e-4, rtol=1e-4)  # fp32 rounding through the decoder
    dispatch_calls.clear()
    assert torch.equal(_image(pipe), default) and all(backend is None for backend, _ in dispatch_calls)


@pytest.mark.parametrize("family", ["infinity", "hart"])
def test_per_scale_calls_of_a_grouped_pass_equal_the_masked_call(family, request, monkeypatch, dispatch_calls):
    pipe = request.getfixturevalue(family)
    masked = _image(pipe, _lazyvar(pipe))
    assert any(has_mask for _, has_mask in dispatch_calls)  # the group ran with its block-causal mask
    monkeypatch.setattr(VARAttnProcessor, "grouped_attention", "per_scale")
    dispatch_calls.clear()
    per_scale = _image(pipe, _lazyvar(pipe))
    # no self-attention call carries a mask any more (Infinity's cross-attention keeps its text mask)
    if family == "hart":
        assert dispatch_calls and not any(has_mask for _, has_mask in dispatch_calls)
    torch.testing.assert_close(per_scale, masked, atol=1e-4, rtol=1e-4)
    assert not torch.equal(per_scale, _image(pipe))  # LazyVAR acted


def test_backends_without_a_boolean_mask_get_per_scale_calls():
    processor = VARAttnProcessor()
    assert not processor.uses_per_scale_calls()  # default "native" takes the mask
    with attention_backend("flex"):
        assert processor.uses_per_scale_calls()
    with attention_backend("_native_math"):
        assert not processor.uses_per_scale_calls()
    processor._attention_backend = AttentionBackendName.FLASH
    assert processor.uses_per_scale_calls()
    processor.grouped_attention = "mask"
    assert not processor.uses_per_scale_calls()
    processor.grouped_attention = "scales"
    with pytest.raises(ValueError, match="'scales'"):
        processor.uses_per_scale_calls()


@pytest.mark.parametrize(
    "scale_ids",
    [
        torch.tensor([2, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4, 4, 4]),  # the loop's order: prefixes, no gather
        torch.tensor([4, 2, 3, 4, 3, 4, 2, 4, 3]),  # any order
        torch.tensor([[2, 3, 3, 4, 4, 4], [2, 2, 3, 4, 3, 4]]),  # routed tokens, one selection per row
    ],
)
def test_block_causal_calls_equal_the_masked_attention(scale_ids):
    g = torch.Generator().manual_seed(0)
    R, H, c, cache = 2, 3, 8, 5
    L = scale_ids.shape[-1]
    q = torch.randn(R, L, H, c, generator=g)
    k, v = torch.randn(R, cache + L, H, c, generator=g), torch.randn(R, cache + L, H, c, generator=g)
    mask = block_causal_mask(cache, scale_ids)
    reference = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=0.3
    ).transpose(1, 2)
    for slice_size in (None, 1):
        processor = VARAttnProcessor()
        processor.slice_size = slice_size
        out = processor._attend_block_causal(q, k, v, cache, scale_ids, 0.3)
        torch.testing.assert_close(out, reference, atol=1e-6, rtol=1e-5)


def test_flex_runs_a_grouped_pass_as_per_scale_calls(hart, dispatch_calls):
    """flex takes no boolean mask efficiently, so the grouped pass reaches it as mask-free calls (HART: no text mask)."""
    default = _image(hart, _lazyvar(hart))
    dispatch_calls.clear()
    with attention_backend("flex"):
        flex = _image(hart, _lazyvar(hart))
    assert dispatch_calls and not any(has_mask for _, has_mask in dispatch_calls)
    torch.testing.assert_close(flex, default, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", ["infinity", "hart"])
def test_every_backend_gets_q_k_and_v_in_the_autocast_dtype(family, monkeypatch):
    """Under autocast v leaves its projection in the autocast dtype; q and k are written in it too, whatever the
    backend (flash-attn refuses mixed dtypes, and an SDPA backend would fill the KV cache with fp32 keys)."""
    if family == "infinity":
        pipe = build_tiny_infinity_pipeline(seed=0, depth=2)
    else:
        pipe = build_tiny_hart_pipeline(seed=0, depth=2, embed_dim=32, patch_nums=(1, 2, 3), tokenizer_ch_mult=(1,))
    pipe = pipe.to(dtype=torch.bfloat16)  # half-precision weights: the pipeline runs under bf16 autocast
    pipe.set_progress_bar_config(disable=True)
    seen = []
    real = attention_processor.dispatch_attention_fn

    def spy(q, k, v, *args, **kwargs):
        seen.append((q.dtype, k.dtype, v.dtype))
        return real(q, k, v, *args, **kwargs)

    monkeypatch.setattr(attention_processor, "dispatch_attention_fn", spy)
    with attention_backend("_native_math"):
        _image(pipe)
    self_attention = [dtypes for dtypes in seen if dtypes[2] == torch.bfloat16]
    assert self_attention and all(dtypes == (torch.bfloat16,) * 3 for dtypes in self_attention), set(seen)
