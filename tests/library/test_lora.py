"""LoRA on both transformers, with every acceleration method: an adapter acts where it is loaded, or is refused.

peft's LoRA layer acts only where its module is called. Each case puts one random LoRA on every adaptable Linear of
the tiny model (the fused q/k/v and k/v projections included: the attention calls them as modules) and checks that

* the images equal those of a model whose weights have each delta added by hand (within float rounding: the unmerged
  LoRA adds ``B(A x)`` to ``W x`` instead of multiplying by ``W + BA``) and differ clearly from the baseline;
* ``fuse_lora`` gives the hand-merged images bit for bit; ``unfuse_lora`` the unmerged adapter's images bit for bit
  (the weights restored exactly); ``unload_lora`` the baseline bit for bit;

and, per family, that a LoRA on a module the model reads without calling is refused, naming the module; that the
pipeline-level API (``load_lora_weights`` of a peft-format state dict, ``set_adapters``) loads and weights it.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn as nn

from registry_lists import METHOD_FAMILY_CASES, SMALLEST_SIZE, tiny_preset

peft = pytest.importorskip("peft")

from peft import LoraConfig  # noqa: E402
from peft.tuners.tuners_utils import BaseTunerLayer  # noqa: E402


def images(pipe, family, acceleration=None):
    return pipe(
        "a red fox",
        generator=torch.Generator().manual_seed(0),
        acceleration=acceleration,
        guidance_scale=3.0,
        output_type="latent",  # the summed codes: the VAE decode adds nothing to what is compared, only time
        **SMALLEST_SIZE[family],
    ).images


def adaptable_linears(transformer):
    """Every Linear of ``transformer`` not in its refused patterns (the generic names: one per kind of module)."""
    refused = list(transformer._lora_refused_modules)
    return sorted(
        name
        for name, module in transformer.named_modules()
        if isinstance(module, nn.Linear) and not any(re.fullmatch(p, name) for p in refused)
    )


def add_random_lora(transformer, name="default"):
    """A rank-2 LoRA on every adaptable Linear, with random A and B of a size that changes the images clearly."""
    targets = adaptable_linears(transformer)
    transformer.add_adapter(LoraConfig(r=2, lora_alpha=2, target_modules=targets, init_lora_weights=False), name)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for module in transformer.modules():
            if isinstance(module, BaseTunerLayer):
                for part in (module.lora_A[name], module.lora_B[name]):
                    part.weight.copy_(torch.randn(part.weight.shape, generator=generator) * 0.3)
    return targets


def lora_deltas(transformer, name="default"):
    return {n: m.get_delta_weight(name) for n, m in transformer.named_modules() if isinstance(m, BaseTunerLayer)}


@pytest.fixture
def restored(pipes):
    """Runs the test, then puts every Linear weight of both tiny transformers back and removes any adapter."""
    saved = {}
    for family in ("infinity", "hart"):
        transformer = pipes(family).transformer
        saved[family] = {
            n: m.weight.detach().clone() for n, m in transformer.named_modules() if isinstance(m, nn.Linear)
        }
    yield
    for family, weights in saved.items():
        transformer = pipes(family).transformer
        if getattr(transformer, "peft_config", None):
            transformer.unload_lora()
        with torch.no_grad():
            for name, module in transformer.named_modules():
                if name in weights:
                    module.weight.copy_(weights[name])


def assert_rounding_close(adapted, merged):
    """The unmerged LoRA computes ``W x + B(A x)``, the merged ``(W + BA) x``: float rounding apart, carried through
    the blocks (and HART's diffusion head)."""
    torch.testing.assert_close(adapted, merged, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("family", ["infinity", "hart"])
def test_a_lora_acts_as_its_merged_delta_and_unloads_to_the_baseline(family, pipes, restored):
    pipe = pipes(family)
    transformer = pipe.transformer
    baseline = images(pipe, family)
    targets = add_random_lora(transformer)
    fused_projections = ("mat_qkv", "mat_kv") if family == "infinity" else ("qkv_proj",)
    assert all(any(t.endswith(p) for t in targets) for p in fused_projections)
    adapted = images(pipe, family)
    deltas = lora_deltas(transformer)
    assert set(deltas) == set(targets)
    transformer.fuse_lora()
    fused = images(pipe, family)
    transformer.unfuse_lora()
    assert torch.equal(images(pipe, family), adapted)  # unfused: the weights bit for bit, the adapter unmerged
    transformer.unload_lora()
    assert not any(isinstance(m, BaseTunerLayer) for m in transformer.modules())
    assert torch.equal(images(pipe, family), baseline)
    with torch.no_grad():  # the deltas merged by hand
        modules = dict(transformer.named_modules())
        for name, delta in deltas.items():
            modules[name].weight.add_(delta)
    merged = images(pipe, family)
    assert torch.equal(fused, merged)
    assert (adapted - baseline).abs().max() > 0.05  # the LoRA changed the output
    assert_rounding_close(adapted, merged)


def run_recording(pipe, family, scheduler):
    """The latents of one call, the tokens of every scale, and per pass that ran the blocks the LoRA layers called."""
    tokens, called, calls = {}, [], []
    hooks = [
        m.register_forward_hook(lambda module, args, out, name=n: called.append(name))
        for n, m in pipe.transformer.named_modules()
        if isinstance(m, BaseTunerLayer)
    ]

    def record(p, scale_index, scale, values):
        if values["tokens"] is not None:  # a skipped scale samples none
            tokens[scale_index] = values["tokens"].clone()
        if called:
            calls.append(set(called))
            called.clear()
        return {}

    try:
        latents = pipe(
            "a red fox",
            generator=torch.Generator().manual_seed(0),
            acceleration=scheduler,
            guidance_scale=3.0,
            output_type="latent",
            callback_on_step_end=record,
            callback_on_step_end_tensor_inputs=["tokens"],
            **SMALLEST_SIZE[family],
        ).images
    finally:
        for hook in hooks:
            hook.remove()
    return latents, tokens, calls


@pytest.mark.parametrize("method, family", METHOD_FAMILY_CASES)
def test_a_lora_acts_under_every_method(method, family, pipes, restored):
    """With the method on, every LoRA layer runs in every pass that runs the blocks (a projection the method's path
    read without calling would not), and the unmerged LoRA equals the fused one (whose weights are the hand-merged
    ones, previous test) within float rounding. A method that ranks every token by a continuous score (DepthVAR:
    ``batch_equals_single_runs = False``) sees that rounding in its ranking, which can swap near-tied tokens; it is
    held to equal tokens on the scales before the first one it acts on."""
    pipe = pipes(family)
    transformer = pipe.transformer
    scheduler = tiny_preset(method, family)
    targets = set(add_random_lora(transformer))
    adapted, adapted_tokens, calls = run_recording(pipe, family, scheduler)
    summary = pipe.acceleration_summary()
    transformer.fuse_lora()
    fused, fused_tokens, _ = run_recording(pipe, family, scheduler)
    transformer.unfuse_lora()
    transformer.unload_lora()
    ran = [p for p in summary["passes"] if not p["skipped"]]
    assert len(calls) == len(ran) and set().union(*calls) == targets
    # the blocks' projections run in every pass (the cross-attention's text keys/values once per call)
    per_pass = {t for t in targets if t.startswith("blocks.") and not t.endswith("ca.mat_kv")}
    for work, called in zip(ran, calls):
        if work["fewest_tokens_computed"] > 0:  # every layer computed some token: every adapted projection ran
            assert per_pass <= called, (work["scales"], sorted(per_pass - called))
    if scheduler.batch_equals_single_runs:
        assert_rounding_close(adapted, fused)
    else:
        first = min(
            scheduler.acted_scales(pipe.scale_schedule_for(**SMALLEST_SIZE[family])[0])
            if family == "infinity"
            else scheduler.acted_scales([(1, p, p) for p in pipe.transformer.config.patch_nums])
        )
        assert first > 0
        for si in range(first):
            assert torch.equal(adapted_tokens[si], fused_tokens[si]), si


def test_a_lora_on_a_module_read_without_a_call_is_refused_naming_it(pipes):
    transformer = pipes("infinity").transformer
    with pytest.raises(ValueError, match=r"InfinityTransformer\.lvl_embed.*cannot take a LoRA"):
        transformer.add_adapter(LoraConfig(r=2, target_modules=["lvl_embed", "fc1"]), "bad")
    assert not getattr(transformer, "peft_config", {}) or "bad" not in transformer.peft_config
    assert not any(isinstance(m, BaseTunerLayer) for m in transformer.modules())


@pytest.mark.parametrize("family", ["infinity"])  # the loader is the same for both families
def test_pipeline_loads_a_peft_state_dict_and_weights_adapters(family, pipes, tmp_path):
    """``pipe.load_lora_weights`` of a peft-format file (keys ``transformer.<module>.lora_A.weight``), then
    ``set_adapters`` with weight 0 is the baseline and ``unload_lora_weights`` restores the model."""
    from peft import get_peft_model_state_dict

    pipe = pipes(family)
    transformer = pipe.transformer
    baseline = images(pipe, family)
    add_random_lora(transformer, "trained")
    adapted = images(pipe, family)
    state = {
        f"transformer.{k}": v.clone()
        for k, v in get_peft_model_state_dict(transformer, adapter_name="trained").items()
    }
    transformer.unload_lora()
    pipe.save_lora_weights(
        tmp_path, transformer_lora_layers={k.removeprefix("transformer."): v for k, v in state.items()}
    )
    try:
        pipe.load_lora_weights(tmp_path, adapter_name="style")
        assert pipe.get_active_adapters() == ["style"]
        assert torch.equal(images(pipe, family), adapted)
        pipe.set_adapters(["style"], adapter_weights=[0.0])
        assert torch.equal(images(pipe, family), baseline)
    finally:
        pipe.unload_lora_weights()
    assert not any(isinstance(m, BaseTunerLayer) for m in transformer.modules())
