"""diffusers' group offloading (``pipe.enable_group_offload``, ``apply_group_offloading``) with every method.

On the CPU the onload and offload devices are the same, so an offload to memory moves nothing and proves nothing.
These tests offload to disk and *poison* every tensor a group offloads (NaN for floats, a huge value for integers)
the moment it is offloaded: a weight read while its group is offloaded makes the image NaN or different, so the image
equal to the one without offload, bit for bit, shows every weight was on the device when it was read (before the
resident groups of ``models/group_offload.py`` this failed: NaN at scale 0 on both families, both levels). Counted
onloads show the weights really left and came back.

safetensors' ``load_file`` on the CPU hands back tensors at 8-byte-aligned addresses inside the file's mapping, and
the CPU's matmul kernels round differently for an unaligned operand (HART's tiny transformer: 9.5e-5 off at block
level); the tests therefore copy each loaded tensor to a fresh (64-byte-aligned) one, as a load to an accelerator
does. The values are the file's.
"""

from __future__ import annotations

import collections

import pytest
import safetensors.torch
import torch
from diffusers.hooks import apply_group_offloading
from diffusers.hooks.group_offloading import ModuleGroup

from diffusers_var_accel.models.group_offload import group_tensors, resident_groups, tied_leaf_modules
from diffusers_var_accel.pipelines.hart.tiny import build_tiny_hart_pipeline
from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline
from diffusers_var_accel.schedulers.composition import ComposedScheduler

from conftest import tiny_hart_patch_nums
from registry_lists import tiny_preset

METHODS = ("baseline", "fastvar", "lazyvar", "depthvar", "arvar", "stagevar", "lazyvar+depthvar")
COMPONENTS = ("text_encoder", "transformer", "vae")


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    yield


def build(family):
    if family == "infinity":
        pipe = build_tiny_infinity_pipeline(seed=0, depth=6)
    else:
        pipe = build_tiny_hart_pipeline(
            seed=0, depth=4, embed_dim=32, patch_nums=tiny_hart_patch_nums(), tokenizer_ch_mult=(1,)
        )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def acceleration(method, family):
    """The method's preset with the overrides the tiny models need (each member's, for a composition)."""
    if method == "baseline":
        return None
    if "+" in method:
        return ComposedScheduler([tiny_preset(member, family) for member in method.split("+")])
    return tiny_preset(method, family)


def generate(pipe, method, family):
    size = {"height": 144, "width": 432} if family == "infinity" else {}  # 7 scales of the tiny Infinity
    return pipe(
        "a red fox in the snow",
        generator=torch.Generator().manual_seed(1),
        output_type="pt",
        acceleration=acceleration(method, family),
        **size,
    ).images


@pytest.fixture
def poisoned_disk_offload(monkeypatch):
    """Poison what each group offloads; count onloads per group; aligned copies of what safetensors loads."""
    onloads = collections.Counter()
    offload, onload, load_file = ModuleGroup.offload_, ModuleGroup.onload_, safetensors.torch.load_file

    def poisoning_offload(group):
        offload(group)
        assert group.offload_to_disk_path is not None  # a memory offload on the CPU would poison the real weights
        for tensor in group_tensors(group):
            tensor.data.fill_(float("nan") if tensor.is_floating_point() else 2**30)

    def counting_onload(group):
        onloads[group.group_id] += 1
        onload(group)

    monkeypatch.setattr(ModuleGroup, "offload_", poisoning_offload)
    monkeypatch.setattr(ModuleGroup, "onload_", counting_onload)
    monkeypatch.setattr(
        safetensors.torch, "load_file", lambda *a, **k: {n: t.clone() for n, t in load_file(*a, **k).items()}
    )
    return onloads


def block_is_offloaded(pipe) -> bool:
    """Every floating tensor of the first block is a poisoned placeholder."""
    return all(t.isnan().all() for t in pipe.transformer.blocks[0].parameters() if t.is_floating_point())


@pytest.mark.parametrize("family", ["infinity", "hart"])
@pytest.mark.parametrize("offload_type", ["block_level", "leaf_level"])
def test_group_offload_to_disk_gives_the_same_images_with_every_method(
    family, offload_type, poisoned_disk_offload, tmp_path
):
    reference_pipe = build(family)
    reference = {method: generate(reference_pipe, method, family) for method in METHODS}
    assert not torch.equal(reference["baseline"], reference["lazyvar"])  # the methods change the image

    pipe = build(family)
    kwargs = {"num_blocks_per_group": 2} if offload_type == "block_level" else {}
    # T5's tied embeddings cannot be disk-offloaded leaf by leaf (see the refusal test): its text encoder stays put
    exclude = ["text_encoder"] if (family, offload_type) == ("infinity", "leaf_level") else None
    pipe.enable_group_offload(
        torch.device("cpu"),
        offload_type=offload_type,
        offload_to_disk_path=str(tmp_path),
        exclude_modules=exclude,
        **kwargs,
    )
    assert block_is_offloaded(pipe)  # the weights left (poisoned placeholders) before the first call
    for method in METHODS:
        poisoned_disk_offload.clear()
        image = generate(pipe, method, family)
        assert torch.equal(image, reference[method]), method
        # and came back: every block group was loaded from disk at least once per pass, then left again
        assert len(poisoned_disk_offload) > len(pipe.transformer.blocks) // 2, method
        assert block_is_offloaded(pipe), method
        resident = [g for name in ("transformer", "vae") for g in resident_groups(getattr(pipe, name))]
        assert resident and all(t.isnan().all() for g in resident for t in group_tensors(g) if t.is_floating_point())


@pytest.mark.parametrize("family", ["infinity", "hart"])
def test_apply_group_offloading_on_the_models_directly(family, poisoned_disk_offload, tmp_path):
    """``diffusers.hooks.apply_group_offloading(pipe.transformer, ...)`` (and on the VAE) works as the pipeline's."""
    reference = generate(build(family), "lazyvar", family)
    pipe = build(family)
    for name in ("transformer", "vae"):
        apply_group_offloading(
            getattr(pipe, name),
            onload_device=torch.device("cpu"),
            offload_type="block_level",
            num_blocks_per_group=1,
            offload_to_disk_path=str(tmp_path / name),
        )
    assert torch.equal(generate(pipe, "lazyvar", family), reference)
    assert block_is_offloaded(pipe)


def hooked_modules(pipe) -> list:
    """Modules with a diffusers hook registered (the transformers give every non-leaf module an empty registry that
    refuses step caches, so the registry's presence alone says nothing)."""
    return [
        m
        for c in COMPONENTS
        for m in getattr(pipe, c).modules()
        if getattr(getattr(m, "_diffusers_hook", None), "hooks", None)
    ]


def test_streams_on_the_cpu_raise_diffusers_error_before_any_hook(tmp_path):
    pipe = build("hart")
    with pytest.raises(ValueError, match="Using streams for data transfer requires an onload device"):
        pipe.enable_group_offload(torch.device("cpu"), num_blocks_per_group=1, use_stream=True)
    assert not hooked_modules(pipe)


def test_leaf_level_disk_offload_of_tied_layers_is_refused_before_any_hook(tmp_path):
    """T5's ``shared`` and ``encoder.embed_tokens`` hold one parameter: diffusers would save the second layer's file
    after the first replaced the tensor by an empty placeholder (garbage embeddings)."""
    pipe = build("infinity")
    assert tied_leaf_modules(pipe.text_encoder) == ["encoder.embed_tokens", "shared"]
    with pytest.raises(ValueError, match=r"wrong weights into text_encoder: its layers \['encoder.embed_tokens', "):
        pipe.enable_group_offload(torch.device("cpu"), offload_type="leaf_level", offload_to_disk_path=str(tmp_path))
    assert not hooked_modules(pipe)
