"""The Hub pipeline.py shim: DiffusionPipeline.from_pretrained(repo, trust_remote_code=True) returns our pipelines,
checked offline against a hand-built Hub cache with tiny random-weight Infinity and HART pipelines."""

from __future__ import annotations

import json
import sys

import diffusers.utils.dynamic_modules_utils as dynamic_modules_utils
import pytest
import torch
from diffusers import DiffusionPipeline

from diffusers_var_accel import HARTPipeline, InfinityPipeline
from diffusers_var_accel.hub import has_hub_shim, hub_shim_source, remove_hub_shim, write_hub_shim, write_to_hub_cache
from diffusers_var_accel.pipelines.hart.tiny import build_tiny_hart_pipeline
from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline

PROMPT = "a red fox in the snow"
KINDS = {
    "infinity": (build_tiny_infinity_pipeline, InfinityPipeline, dict(height=256, width=256)),
    "hart": (build_tiny_hart_pipeline, HARTPipeline, {}),
}


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    yield


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Each tiny pipeline saved once (plain save_pretrained output, no shim)."""
    folders = {}
    for kind, (build, _, _) in KINDS.items():
        folders[kind] = tmp_path_factory.mktemp(f"tiny_{kind}")
        build(seed=0).save_pretrained(folders[kind])
    return folders


@pytest.fixture
def offline_hub(offline_hub, tmp_path, monkeypatch):
    """The shared offline Hub cache plus a private diffusers modules cache (where pipeline.py is copied and imported)."""
    cache = offline_hub
    monkeypatch.setattr(dynamic_modules_utils, "HF_MODULES_CACHE", str(tmp_path / "modules"))
    monkeypatch.setattr(sys, "path", list(sys.path))  # diffusers appends the modules cache to sys.path
    before = {k for k in sys.modules if k.startswith("diffusers_modules")}
    yield cache
    for name in [k for k in sys.modules if k.startswith("diffusers_modules") and k not in before]:
        del sys.modules[name]


def run(pipe, size, seed=0):
    pipe.set_progress_bar_config(disable=True)
    return pipe(PROMPT, generator=torch.Generator().manual_seed(seed), output_type="pt", **size).images


def index(folder):
    return json.loads((folder / "model_index.json").read_text())


# ---------------------------------------------------------------------------------------------------------------------
# writing the shim
# ---------------------------------------------------------------------------------------------------------------------
def test_write_and_remove_the_shim(saved, tmp_path):
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(saved["hart"], folder)
    plain = index(folder)
    assert plain["_class_name"] == "HARTPipeline" and not has_hub_shim(folder)
    shim = write_hub_shim(folder)
    assert shim.read_text() == hub_shim_source("HARTPipeline")
    assert shim.read_text().count("\n") == 1 and shim.read_text().startswith(
        "from diffusers_var_accel import HARTPipeline"
    )
    assert index(folder) == {**plain, "_class_name": ["pipeline", "HARTPipeline"]}  # nothing else changes
    assert has_hub_shim(folder)
    write_hub_shim(folder)  # idempotent
    assert index(folder)["_class_name"] == ["pipeline", "HARTPipeline"] and shim.read_text() == hub_shim_source(
        "HARTPipeline"
    )
    remove_hub_shim(folder)
    assert index(folder) == plain and not shim.exists()


def test_the_shim_refuses_foreign_code_and_foreign_pipelines(saved, tmp_path):
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(saved["infinity"], folder)
    (folder / "pipeline.py").write_text("import os\n")
    with pytest.raises(ValueError, match="not the diffusers_var_accel shim"):
        write_hub_shim(folder)
    assert index(folder)["_class_name"] == "InfinityPipeline"  # untouched
    with pytest.raises(ValueError, match="not the diffusers_var_accel shim"):
        remove_hub_shim(folder)
    write_hub_shim(folder, overwrite=True)
    assert has_hub_shim(folder)
    (folder / "pipeline.py").write_text(hub_shim_source("InfinityPipeline") + "import os\n")
    assert not has_hub_shim(folder)
    other = tmp_path / "other"
    other.mkdir()
    (other / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionPipeline"}))
    with pytest.raises(ValueError, match="StableDiffusionPipeline"):
        write_hub_shim(other)
    with pytest.raises(ValueError, match="no model_index.json"):
        write_hub_shim(tmp_path / "empty")


# ---------------------------------------------------------------------------------------------------------------------
# loading from a Hub repo (offline cache)
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_diffusion_pipeline_loads_our_pipeline_from_the_hub(kind, saved, offline_hub):
    _, cls, size = KINDS[kind]
    reference = run(cls.from_pretrained(saved[kind]), size)
    repo_id = f"fake-org/tiny-{kind}"
    snapshot = write_to_hub_cache(saved[kind], repo_id, offline_hub)
    write_hub_shim(snapshot)

    pipe = DiffusionPipeline.from_pretrained(repo_id, trust_remote_code=True, cache_dir=offline_hub)
    assert type(pipe) is cls  # the installed class itself, not a copy imported from the modules cache
    assert torch.equal(run(pipe, size), reference)
    assert not torch.equal(run(pipe, size, seed=1), reference)  # the comparison can fail

    with pytest.raises(ValueError, match="trust_remote_code=True"):
        DiffusionPipeline.from_pretrained(repo_id, cache_dir=offline_hub)
    # our own class checks that pipeline.py is exactly its one-line shim, so it needs no trust_remote_code
    direct = cls.from_pretrained(repo_id, cache_dir=offline_hub)
    assert type(direct) is cls
    assert all(
        torch.equal(a, b)
        for a, b in zip(direct.transformer.state_dict().values(), pipe.transformer.state_dict().values())
    )


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_changed_shim_needs_trust_remote_code_again(kind, saved, tmp_path, offline_hub):
    _, cls, _ = KINDS[kind]
    folder = tmp_path / "shimmed"
    cls.from_pretrained(saved[kind]).save_pretrained(folder)
    write_hub_shim(folder)
    assert type(cls.from_pretrained(folder)) is cls  # a local shimmed folder, no trust_remote_code
    (folder / "pipeline.py").write_text(hub_shim_source(cls.__name__) + "import os\n")
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        cls.from_pretrained(folder)
    other = (set(KINDS) - {kind}).pop()
    (folder / "pipeline.py").write_text(hub_shim_source(KINDS[other][1].__name__))  # the shim of the other class
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        cls.from_pretrained(folder)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_without_the_shim_the_generic_loaders_resolve_the_registered_class(kind, saved, offline_hub):
    """diffusers looks a plain _class_name up in its own namespace (DiffusionPipeline) and in its text-to-image
    mapping (AutoPipelineForText2Image); importing diffusers_var_accel registers our two classes in both."""
    from diffusers import AutoPipelineForText2Image

    _, cls, size = KINDS[kind]
    reference = run(cls.from_pretrained(saved[kind]), size)
    repo_id = f"fake-org/plain-{kind}"
    write_to_hub_cache(saved[kind], repo_id, offline_hub)
    for loader in (DiffusionPipeline, AutoPipelineForText2Image):
        for source, kwargs in ((saved[kind], {}), (repo_id, {"cache_dir": offline_hub})):
            pipe = loader.from_pretrained(source, **kwargs)
            assert type(pipe) is cls
            assert torch.equal(run(pipe, size), reference)


def test_registration_never_replaces_a_diffusers_name():
    import diffusers

    from diffusers_var_accel.pipelines.diffusers_registration import register_pipelines_with_diffusers

    class FluxPipeline(InfinityPipeline):  # a name diffusers defines
        pass

    register_pipelines_with_diffusers(FluxPipeline)
    assert diffusers.FluxPipeline is not FluxPipeline and diffusers.FluxPipeline.__module__.startswith("diffusers.")
    assert diffusers.InfinityPipeline is InfinityPipeline and diffusers.HARTPipeline is HARTPipeline


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_component_entries_may_name_the_top_level_package(kind, saved, tmp_path):
    """["diffusers_var_accel", "<class>"] (the package, not the defining module) also loads: diffusers takes the class
    from the imported module named in model_index.json, and the package exports every component class."""
    _, cls, size = KINDS[kind]
    folder = tmp_path / "top_level"
    cls.from_pretrained(saved[kind]).save_pretrained(folder)
    data = index(folder)
    for name in ("transformer", "vae"):
        data[name] = ["diffusers_var_accel", data[name][1]]
    (folder / "model_index.json").write_text(json.dumps(data))
    assert torch.equal(
        run(DiffusionPipeline.from_pretrained(folder), size), run(cls.from_pretrained(saved[kind]), size)
    )
