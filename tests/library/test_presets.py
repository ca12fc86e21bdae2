"""Packaged acceleration presets: JSON files in the package, loaded by name, from a Hub repo (offline) and written
in the same layout by save_pretrained / push_to_hub / save_presets. No model runs here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from diffusers_var_accel import DepthVARScheduler, FastVARScheduler, LazyVARScheduler, VARAccelScheduler
from diffusers_var_accel.hub import save_presets, write_to_hub_cache
from diffusers_var_accel.schedulers import presets as presets_module
from diffusers_var_accel.schedulers.presets import (
    FAMILY_PRESET_MODELS,
    PackagedPresets,
    available_presets,
)
from diffusers_var_accel.schedulers.specs import load_acceleration
from registry_lists import METHODS
from registry_lists import PRESET_MODELS as MODELS

NAMES = sorted(f"{model}/{method}" for model in MODELS for method in METHODS)
#: The embedded model's own presets, made by var-accel calibrate (tests/test_calibration.py checks them).
EMBEDDED_NAMES = sorted(f"embedded/{method}" for method in METHODS)


def stored(folder: Path) -> dict:
    """An acceleration_config.json without the diffusers version stamp."""
    config = json.loads((Path(folder) / "acceleration_config.json").read_text())
    config.pop("_diffusers_version", None)
    return config


def as_json(value):
    return json.loads(json.dumps(value))


# ---------------------------------------------------------------------------------------------------------------------
# the files
# ---------------------------------------------------------------------------------------------------------------------
def test_every_method_has_a_preset_per_model():
    assert available_presets() == sorted(NAMES + EMBEDDED_NAMES)
    assert available_presets(method="lazyvar") == ["embedded/lazyvar", "hart-0.7b/lazyvar", "infinity-2b/lazyvar"]
    assert available_presets(model="hart-0.7b") == [f"hart-0.7b/{m}" for m in sorted(METHODS)]
    assert FAMILY_PRESET_MODELS == {family: model for model, family in MODELS.items()}


@pytest.mark.parametrize("name", NAMES)
def test_a_preset_file_is_what_save_pretrained_writes(name, tmp_path):
    model, method = name.split("/")
    folder = presets_module.PRESETS_DIR / model / method
    config = stored(folder)
    assert config["_class_name"] == METHODS[method].__name__ and config["model_family"] == MODELS[model]
    scheduler = VARAccelScheduler.from_pretrained(name)
    assert type(scheduler) is METHODS[method]
    scheduler.save_pretrained(tmp_path)
    assert stored(tmp_path) == config  # complete (every setting) and canonical
    # the class attribute and from_preset read the same file
    assert as_json(METHODS[method].from_preset(MODELS[model]).to_dict()) == as_json(scheduler.to_dict())
    assert METHODS[method].presets.names()[MODELS[model]] == name


def test_the_published_settings():
    """The published points (papers / official code); a changed JSON file fails here."""
    got = {
        name: {k: v for k, v in stored(presets_module.PRESETS_DIR / name).items() if not k.startswith("_")}
        for name in NAMES
    }
    assert got["infinity-2b/fastvar"] == {
        "prune_scales": [-4, -3],
        "prune_ratios": [0.4, 0.5],
        "pruned_layers": [3, 28],
        "cache_scale": -5,
        "skip_last_scales": True,
        "skipped_scales": [-2, -1],
        "model_family": "infinity",
    }
    assert got["hart-0.7b/fastvar"] == {
        "prune_scales": [-2, -1],
        "prune_ratios": [0.5, 0.75],
        "pruned_layers": None,
        "cache_scale": -3,
        "skip_last_scales": False,
        "skipped_scales": [],
        "model_family": "hart",
    }
    assert (got["infinity-2b/lazyvar"]["group_scales"], got["infinity-2b/lazyvar"]["keep_ratios"]) == (
        [-4, -3, -2, -1],
        [0.2, 0.1, 0.05, 0.01],
    )
    assert (got["hart-0.7b/lazyvar"]["group_scales"], got["hart-0.7b/lazyvar"]["keep_ratios"]) == (
        [-2, -1],
        [0.5, 0.35],
    )
    assert got["infinity-2b/depthvar"]["reference_scale"] == -5 and got["hart-0.7b/depthvar"]["reference_scale"] == 10
    for model in MODELS:
        arvar = got[f"{model}/arvar"]
        assert (arvar["branch_halving_scales"], arvar["pruned_scales"], arvar["prune_ratios"]) == ([-2], [-1], [0.75])
        assert (arvar["attention_distance"], arvar["activation_distance"]) == (3, 2)
    # StageVAR (FasterVAR's released scripts): Infinity guidance off on 40-64², 40² projected in 8 chunks, 48-64²
    # skipped; HART guidance off on 48-64², 64² projected layer by layer on the min(N, C) basis at the drawn positions
    infinity, hart = got["infinity-2b/stagevar"], got["hart-0.7b/stagevar"]
    assert (infinity["unconditional_scales"], infinity["projected_scales"], infinity["skipped_scales"]) == (
        [-3, -2, -1],
        [-3],
        [-2, -1],
    )
    assert (infinity["num_chunks"], infinity["rank_basis"], infinity["mixture_positions"]) == (8, "tokens", "first")
    assert [int(r * 1600) + 1 for r in infinity["rank_ratios"][0]] == [
        27,
        219,
        337,
        401,
        410,
        317,
        252,
        306,
    ]  # spec §2.2
    assert (hart["unconditional_scales"], hart["projected_scales"], hart["skipped_scales"]) == ([-2, -1], [-1], [])
    assert (hart["num_chunks"], hart["rank_basis"], hart["mixture_positions"]) == (24, "tokens_or_width", "drawn")
    ranks = [int(r * 1536) + 1 for r in hart["rank_ratios"][0]]
    assert (min(ranks), max(ranks), len(ranks)) == (29, 656, 24)  # spec §2.2: "r runs from 29 to 656"


def test_the_class_presets_are_read_from_the_json_files(tmp_path, monkeypatch):
    """One source of truth: editing a JSON file changes from_preset, enable_<method>'s source and load_acceleration."""
    copy = tmp_path / "presets"
    shutil.copytree(presets_module.PRESETS_DIR, copy)
    path = copy / "infinity-2b" / "lazyvar" / "acceleration_config.json"
    config = json.loads(path.read_text())
    config["keep_ratios"] = [0.3, 0.2, 0.1, 0.05]
    path.write_text(json.dumps(config))
    monkeypatch.setattr(presets_module, "PRESETS_DIR", copy)
    monkeypatch.setattr(LazyVARScheduler.presets, "_by_family", None)  # drop what was read from the real files
    assert LazyVARScheduler.presets["infinity"]["keep_ratios"] == (0.3, 0.2, 0.1, 0.05)
    assert LazyVARScheduler.from_preset("infinity").config.keep_ratios == (0.3, 0.2, 0.1, 0.05)
    assert list(load_acceleration("lazyvar", "infinity").config.keep_ratios) == [0.3, 0.2, 0.1, 0.05]
    assert list(LazyVARScheduler.from_pretrained("infinity-2b/lazyvar").config.keep_ratios) == [0.3, 0.2, 0.1, 0.05]


def test_a_file_of_another_class_is_refused(tmp_path, monkeypatch):
    copy = tmp_path / "presets"
    shutil.copytree(presets_module.PRESETS_DIR, copy)
    shutil.copy(
        copy / "infinity-2b" / "fastvar" / "acceleration_config.json",
        copy / "infinity-2b" / "lazyvar" / "acceleration_config.json",
    )
    monkeypatch.setattr(presets_module, "PRESETS_DIR", copy)
    monkeypatch.setattr(LazyVARScheduler.presets, "_by_family", None)
    with pytest.raises(ValueError, match="stores a FastVARScheduler configuration, not a LazyVARScheduler"):
        LazyVARScheduler.from_preset("infinity")


def test_missing_files_raise_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(presets_module, "PRESETS_DIR", tmp_path / "absent")
    assert available_presets() == []
    with pytest.raises(FileNotFoundError, match="package data"):
        dict(PackagedPresets("lazyvar"))
    with pytest.raises(ValueError, match="package data"):
        LazyVARScheduler.from_pretrained("infinity-2b/lazyvar")  # a preset name, not sent to the Hub


# ---------------------------------------------------------------------------------------------------------------------
# loading by name
# ---------------------------------------------------------------------------------------------------------------------
def test_from_pretrained_by_name_with_overrides():
    lazy = LazyVARScheduler.from_pretrained("infinity-2b/lazyvar", keep_ratios=[0.4, 0.2, 0.1, 0.02])
    assert list(lazy.config.keep_ratios) == [0.4, 0.2, 0.1, 0.02] and lazy.model_family == "infinity"
    hart = VARAccelScheduler.from_pretrained("hart-0.7b/fastvar")
    assert (
        isinstance(hart, FastVARScheduler)
        and hart.model_family == "hart"
        and list(hart.config.prune_ratios) == [0.5, 0.75]
    )
    same = VARAccelScheduler.from_pretrained("hart-0.7b", subfolder="fastvar")  # the package folder is a presets repo
    assert same.to_dict() == hart.to_dict()
    with pytest.raises(ValueError, match="no setting"):
        LazyVARScheduler.from_pretrained("infinity-2b/lazyvar", keep_ratio=0.5)


@pytest.mark.parametrize(
    "call",
    [
        lambda: LazyVARScheduler.from_pretrained("infinity-2b/lazyvarr"),
        lambda: VARAccelScheduler.from_pretrained("hart-0.7b/turbo"),
        lambda: VARAccelScheduler.from_pretrained("infinity-2b", subfolder="turbo"),
    ],
)
def test_an_unknown_name_lists_the_available_ones(call):
    with pytest.raises(ValueError, match="unknown acceleration preset") as err:
        call()
    assert all(name in str(err.value) for name in NAMES)


def test_a_preset_of_another_method_is_refused_with_the_right_class():
    with pytest.raises(ValueError) as err:
        FastVARScheduler.from_pretrained("infinity-2b/lazyvar")
    message = str(err.value)
    assert "LazyVARScheduler configuration, not a FastVARScheduler" in message
    assert (
        "LazyVARScheduler.from_pretrained" in message
        and "['embedded/fastvar', 'hart-0.7b/fastvar', 'infinity-2b/fastvar']" in message
    )


def test_a_local_folder_wins_over_a_preset_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    FastVARScheduler(prune_ratios=(0.1, 0.2)).save_pretrained(tmp_path / "infinity-2b" / "lazyvar")
    loaded = VARAccelScheduler.from_pretrained("infinity-2b/lazyvar")
    assert isinstance(loaded, FastVARScheduler) and list(loaded.config.prune_ratios) == [0.1, 0.2]


def test_load_acceleration_accepts_preset_names():
    lazy = load_acceleration("infinity-2b/lazyvar", "infinity")
    assert lazy.to_dict() == LazyVARScheduler.from_pretrained("infinity-2b/lazyvar").to_dict()
    depth = load_acceleration("infinity-2b/depthvar:reference_scale=7", "infinity")
    assert isinstance(depth, DepthVARScheduler) and depth.config.reference_scale == 7
    fast = load_acceleration("hart-0.7b/fastvar:prune_ratios=[0.25,0.5]", "hart")
    assert list(fast.config.prune_ratios) == [0.25, 0.5] and fast.model_family == "hart"
    with pytest.raises(ValueError, match="is for model family 'hart', not 'infinity'.*infinity-2b/fastvar"):
        load_acceleration("hart-0.7b/fastvar", "infinity")
    with pytest.raises(ValueError, match="unknown acceleration preset 'infinity-2b/turbo'.*infinity-2b/lazyvar"):
        load_acceleration("infinity-2b/turbo", "infinity")
    with pytest.raises(ValueError, match="unknown acceleration 'turbo'.*infinity-2b/lazyvar"):
        load_acceleration("turbo", "infinity")


# ---------------------------------------------------------------------------------------------------------------------
# the same layout on disk and on the Hub
# ---------------------------------------------------------------------------------------------------------------------
def test_save_presets_writes_the_package_layout(tmp_path):
    written = save_presets(tmp_path, "infinity-2b")
    assert sorted(p.name for p in written) == sorted(METHODS)
    for method in METHODS:
        assert stored(tmp_path / method) == stored(presets_module.PRESETS_DIR / "infinity-2b" / method)
    assert (
        LazyVARScheduler.from_pretrained(tmp_path, subfolder="lazyvar").to_dict()
        == LazyVARScheduler.from_pretrained("infinity-2b/lazyvar").to_dict()
    )
    with pytest.raises(ValueError, match="models with presets"):
        save_presets(tmp_path, "sd3")


def test_from_a_hub_repo_subfolder_offline(offline_hub, tmp_path):
    folder = tmp_path / "presets-repo"
    save_presets(folder, "hart-0.7b")
    write_to_hub_cache(folder, "fake-org/var-presets", offline_hub)
    loaded = LazyVARScheduler.from_pretrained("fake-org/var-presets", subfolder="lazyvar", cache_dir=offline_hub)
    assert loaded.to_dict() == LazyVARScheduler.from_pretrained("hart-0.7b/lazyvar").to_dict()
    overridden = VARAccelScheduler.from_pretrained(
        "fake-org/var-presets", subfolder="depthvar", cache_dir=offline_hub, reference_scale=8
    )
    assert isinstance(overridden, DepthVARScheduler) and overridden.config.reference_scale == 8
    with pytest.raises(ValueError, match="not a FastVARScheduler"):
        FastVARScheduler.from_pretrained("fake-org/var-presets", subfolder="lazyvar", cache_dir=offline_hub)
    with pytest.raises(OSError, match="available presets"):
        LazyVARScheduler.from_pretrained("fake-org/absent", subfolder=None, cache_dir=offline_hub)


def test_push_to_hub_uploads_the_same_layout(monkeypatch):
    import diffusers.utils.hub_utils as hub_utils

    uploads = []

    class Repo:
        repo_id = "fake-org/var-presets"

    def fake_upload_folder(repo_id, folder_path, path_in_repo=None, **kwargs):
        files = {str(p.relative_to(folder_path)): p.read_text() for p in Path(folder_path).rglob("*") if p.is_file()}
        uploads.append((repo_id, path_in_repo, files))

    monkeypatch.setattr(hub_utils, "create_repo", lambda *a, **k: Repo())
    monkeypatch.setattr(hub_utils, "upload_folder", fake_upload_folder)
    LazyVARScheduler.from_pretrained("infinity-2b/lazyvar").push_to_hub("fake-org/var-presets", subfolder="lazyvar")
    ((repo_id, path_in_repo, files),) = uploads
    assert (repo_id, path_in_repo, sorted(files)) == ("fake-org/var-presets", "lazyvar", ["acceleration_config.json"])
    pushed = json.loads(files["acceleration_config.json"])
    pushed.pop("_diffusers_version")
    assert pushed == stored(presets_module.PRESETS_DIR / "infinity-2b" / "lazyvar")


def _official_schedules(model):
    """``[(schedule, size)]`` of every official size of a preset model, and its depth."""
    from diffusers_var_accel import HART_CONFIGS, schedule_for_size, supported_sizes
    from diffusers_var_accel.models.transformer_infinity import INFINITY_CONFIGS

    if model == "hart-0.7b":
        patch_nums = HART_CONFIGS[model]["patch_nums"]
        return [(tuple((1, p, p) for p in patch_nums), "1024x1024")], HART_CONFIGS[model]["depth"]
    schedules = [(tuple(map(tuple, schedule_for_size(h, w)[0])), f"{h}x{w}") for h, w in sorted(supported_sizes())]
    return schedules, INFINITY_CONFIGS[model]["depth"]


@pytest.mark.parametrize("model", ["infinity-2b", "hart-0.7b"])
def test_every_preset_plans_at_every_official_size(model):
    """docs/presets_and_hub.md: the presets run at every official size and aspect ratio (7, 10, 12 and 13 scales
    for Infinity)."""
    from diffusers_var_accel.next_scale.plan import ModelInfo, validate_plans

    family = MODELS[model]
    schedules, depth = _official_schedules(model)
    lengths = {len(schedule) for schedule, _ in schedules}
    assert lengths == ({7, 10, 12, 13} if model == "infinity-2b" else {14})
    for method in METHODS:
        scheduler = load_acceleration(f"{model}/{method}", family)
        for schedule, size in schedules:
            validate_plans(scheduler.plan_scales(schedule, ModelInfo(depth, family)), len(schedule))


def test_infinity_depthvar_preset_is_the_papers_r9_on_the_13_scale_sizes():
    """``infinity-2b/depthvar`` counts R from the end (-5) so that it resolves on the 7-scale sizes too; on every
    13-scale size it is the paper's R = 9: the same budgets and the same plans."""
    from diffusers_var_accel.next_scale.plan import ModelInfo

    schedules, depth = _official_schedules("infinity-2b")
    preset = load_acceleration("infinity-2b/depthvar", "infinity")
    paper = load_acceleration("infinity-2b/depthvar:reference_scale=9", "infinity")
    assert preset.config.reference_scale == -5 and paper.config.reference_scale == 9
    long_ones = [(schedule, size) for schedule, size in schedules if len(schedule) == 13]
    assert len(long_ones) >= 10
    for schedule, size in long_ones:
        assert preset.budgets(schedule) == paper.budgets(schedule) and min(preset.budgets(schedule)) == 9, size
        info = ModelInfo(depth, "infinity")
        assert preset.plan_scales(schedule, info) == paper.plan_scales(schedule, info), size
