"""``pipe.enable_model_cpu_offload()`` with acceleration off and on (issue 8, ecosystem behaviour).

Model offload (accelerate's ``CpuOffload`` hooks, installed by diffusers) keeps one component at a time on the
accelerator: a component is moved there by its hook's ``pre_forward`` and back to the CPU (``init_hook``) when the
next component of ``model_cpu_offload_seq`` starts. A pipeline that calls a component's weights without going through
its hook (a method other than ``forward`` that is not wrapped with diffusers' ``apply_forward_hook``) breaks on a GPU
with "tensors on different devices", but not on a CPU, where both "devices" are the same. So these tests run the
offloaded pipeline with the CPU as execution device and *track* where every component would be: each submodule call
asserts that its component is on the execution device at that moment. The images must equal the pipeline without
offload, bit for bit, for every method.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from accelerate.hooks import CpuOffload

from diffusers_var_accel import HART_CONFIGS
from diffusers_var_accel.embedded import EMBEDDED_SAMPLING
from diffusers_var_accel.pipelines.pipeline_loading import load_embedded_pipeline
from diffusers_var_accel.schedulers.specs import load_acceleration
from diffusers_var_accel.pipelines.hart.tiny import build_tiny_hart_pipeline

METHODS = ("baseline", "fastvar", "lazyvar", "depthvar", "arvar")


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    yield


@contextlib.contextmanager
def placement_tracker(pipe):
    """Track which components the offload hooks have put on the execution device; fail on a use of any other."""
    onloaded: set = set()
    uses: list = []
    original_pre, original_init = CpuOffload.pre_forward, CpuOffload.init_hook

    def pre_forward(self, module, *args, **kwargs):
        onloaded.add(id(module))
        return original_pre(self, module, *args, **kwargs)

    def init_hook(self, module):  # called when the hook is added and whenever the component is offloaded
        onloaded.discard(id(module))
        return original_init(self, module)

    handles = []
    pipe.enable_model_cpu_offload(device="cpu")  # the CPU stands in for the accelerator (see the module docstring)
    components = {name: m for name, m in pipe.components.items() if isinstance(m, torch.nn.Module)}
    execution_device = pipe._execution_device
    for name, component in components.items():
        if name in pipe._exclude_from_cpu_offload:  # placed on the execution device once, never offloaded
            assert all(p.device.type == execution_device.type for p in component.parameters()), name
            onloaded.add(id(component))

        def check(submodule, args, name=name, component=component):
            uses.append(name)
            assert id(component) in onloaded, (
                f"{name}.{type(submodule).__name__} ran while {name} was offloaded: a method of {name} other than "
                f"forward uses its weights without the offload hook (wrap it with diffusers' apply_forward_hook)"
            )

        for submodule in list(component.modules())[1:]:  # not the root: its hook runs inside its own forward call
            handles.append(submodule.register_forward_pre_hook(check))
    CpuOffload.pre_forward, CpuOffload.init_hook = pre_forward, init_hook
    try:
        yield uses
    finally:
        CpuOffload.pre_forward, CpuOffload.init_hook = original_pre, original_init
        for handle in handles:
            handle.remove()


def run(pipe, method, family, **kwargs):
    return pipe(
        "a red fox in the snow",
        generator=torch.Generator().manual_seed(1),
        output_type="pt",
        acceleration=load_acceleration(method, family),
        **kwargs,
    ).images


@pytest.mark.parametrize("family", ["infinity", "hart"])
def test_model_cpu_offload_gives_the_same_images_with_every_method(family):
    if family == "infinity":
        build = load_embedded_pipeline  # a trained 6-block model: every preset applies as on the real one
        kwargs = dict(EMBEDDED_SAMPLING)
    else:

        def build():
            return build_tiny_hart_pipeline(
                seed=0,
                depth=4,
                embed_dim=32,
                tokenizer_ch_mult=(1,),
                patch_nums=HART_CONFIGS["hart-0.7b"]["patch_nums"],
            )

        kwargs = dict(guidance_scale=4.5)
    reference_pipe = build()
    reference_pipe.set_progress_bar_config(disable=True)
    reference = {method: run(reference_pipe, method, family, **kwargs) for method in METHODS}
    assert not torch.equal(reference["baseline"], reference["lazyvar"])  # the methods change the image

    pipe = build()
    pipe.set_progress_bar_config(disable=True)
    with placement_tracker(pipe) as uses:
        assert pipe._execution_device == torch.device("cpu", 0)
        for method in METHODS:
            uses.clear()
            image = run(pipe, method, family, **kwargs)
            assert {"text_encoder", "transformer", "vae"} <= set(uses), method  # every component ran under the tracker
            assert torch.equal(image, reference[method]), method
    pipe.remove_all_hooks()


def test_enable_low_memory_is_model_offload_plus_tiled_decoding():
    """The README's low-memory recipe: ``enable_low_memory`` installs diffusers' model offload on every offloaded
    component and turns tiled decoding on; the images stay those of the pipeline without it (tiles only split latents
    larger than a tile, which a tiny model's are not)."""

    def build():
        pipe = build_tiny_hart_pipeline(seed=0, depth=2, embed_dim=32, tokenizer_ch_mult=(1,))
        pipe.set_progress_bar_config(disable=True)
        return pipe

    reference = run(build(), "lazyvar", "hart", guidance_scale=4.5)
    pipe = build()
    with pytest.raises(ValueError, match="tiling must be True or False, got 'yes'"):
        pipe.enable_low_memory(device="cpu", tiling="yes")
    assert not pipe.vae.use_tiling
    pipe.enable_low_memory(device="cpu")
    assert pipe.vae.use_tiling
    offloaded = [
        name
        for name, m in pipe.components.items()
        if isinstance(m, torch.nn.Module) and name not in pipe._exclude_from_cpu_offload
    ]
    assert offloaded and all(isinstance(getattr(pipe.components[n], "_hf_hook", None), CpuOffload) for n in offloaded)
    assert torch.equal(run(pipe, "lazyvar", "hart", guidance_scale=4.5), reference)
    pipe.remove_all_hooks()
    pipe.enable_low_memory(device="cpu", tiling=False)
    assert not pipe.vae.use_tiling
    pipe.remove_all_hooks()
