"""Bad files and folders fail at load time, naming the file and what is wrong; nothing loads half-initialised.

Saved pipeline folders (extra, missing and mis-shaped weight keys, a config that disagrees with its weights, empty
and truncated weights files, invalid JSON, a ``model_index.json`` naming a class that does not exist), official
checkpoint files (truncated or empty ``.pth`` and safetensors), a non-UTF-8 ``model_index.json``, a missing shard or shard
index, a missing or corrupt tokenizer file, a safetensors header that lies about sizes, scheduler configurations (unknown class, unknown
key), string dtypes, and names close to packaged ones (a suggestion is made).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from diffusers_var_accel import (
    HARTPipeline,
    InfinityBSQVAE,
    InfinityPipeline,
    InfinityTransformer,
    LazyVARScheduler,
    VARAccelScheduler,
)
from diffusers_var_accel.models.checkpoint_utils import (
    CheckpointFileError,
    load_original_state_dict,
    resolve_torch_dtype,
)
from diffusers_var_accel.schedulers.presets import preset_folder
from diffusers_var_accel.pipelines.hart.tiny import build_tiny_hart_pipeline
from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline

FIXTURE_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "infinity"
WEIGHTS = "diffusion_pytorch_model.safetensors"


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    yield


@pytest.fixture(scope="module")
def saved_infinity(tmp_path_factory):
    folder = tmp_path_factory.mktemp("infinity") / "pipe"
    build_tiny_infinity_pipeline(seed=0).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def saved_hart(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hart") / "pipe"
    build_tiny_hart_pipeline(seed=0).save_pretrained(folder)
    return folder


@pytest.fixture
def infinity_copy(saved_infinity, tmp_path):
    return Path(shutil.copytree(saved_infinity, tmp_path / "copy"))


def edit_weights(path: Path, edit) -> None:
    state_dict = load_file(path)
    edit(state_dict)
    save_file(state_dict, path)


def edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


# ---------------------------------------------------------------------------------------------------------------------
# saved pipeline folders
# ---------------------------------------------------------------------------------------------------------------------
def test_a_clean_folder_loads_and_matches(saved_infinity):
    pipe = InfinityPipeline.from_pretrained(saved_infinity)
    reference = build_tiny_infinity_pipeline(seed=0)
    for name in ("transformer", "vae"):
        ours, theirs = getattr(pipe, name).state_dict(), getattr(reference, name).state_dict()
        assert set(ours) == set(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)


@pytest.mark.parametrize("component", ["transformer", "vae"])
@pytest.mark.parametrize("problem", ["extra", "missing", "mis-shaped"])
def test_weight_keys_that_do_not_match(infinity_copy, component, problem):
    path = infinity_copy / component / WEIGHTS
    names = sorted(load_file(path))
    victim = names[len(names) // 2]

    def edit(state_dict):
        if problem == "extra":
            state_dict["extra_module.weight"] = torch.zeros(2, 2)
        elif problem == "missing":
            del state_dict[victim]
        else:
            state_dict[victim] = torch.zeros(tuple(state_dict[victim].shape) + (2,))

    edit_weights(path, edit)
    with pytest.raises(ValueError) as info:
        InfinityPipeline.from_pretrained(infinity_copy)
    message = str(info.value)
    assert str(path) in message
    assert ("extra_module.weight" if problem == "extra" else victim) in message
    assert {"extra": "unexpected", "missing": "missing", "mis-shaped": "mis-shaped"}[problem] in message


@pytest.mark.parametrize("problem", ["extra", "missing"])
def test_text_encoder_weights_that_do_not_match(infinity_copy, problem):
    """transformers would initialise a missing weight at random with only a log line."""
    path = infinity_copy / "text_encoder" / "model.safetensors"
    names = sorted(load_file(path))
    victim = next(n for n in names if "layer" in n)
    edit_weights(
        path,
        (lambda sd: sd.update({"stray.weight": torch.zeros(2)}))
        if problem == "extra"
        else (lambda sd: sd.pop(victim)),
    )
    with pytest.raises(ValueError) as info:
        InfinityPipeline.from_pretrained(infinity_copy)
    message = str(info.value)
    assert str(path) in message and ("stray.weight" if problem == "extra" else victim) in message
    assert ("unexpected" if problem == "extra" else "missing") in message


@pytest.mark.parametrize("delta, label", [(1, "missing"), (-1, "unexpected"), (2, "missing")])
def test_config_depth_that_disagrees_with_the_weights(infinity_copy, delta, label):
    config = infinity_copy / "transformer" / "config.json"
    depth = json.loads(config.read_text())["depth"]
    edit_json(config, lambda c: c.update(depth=depth + delta))
    with pytest.raises(ValueError) as info:
        InfinityPipeline.from_pretrained(infinity_copy)
    message = str(info.value)
    block = depth + delta - 1 if delta > 0 else depth - 1
    assert label in message and f"blocks.{block}." in message and str(config) in message


def test_config_width_that_disagrees_with_the_weights(infinity_copy):
    config = infinity_copy / "transformer" / "config.json"
    edit_json(config, lambda c: c.update(text_channels=c["text_channels"] * 2))
    with pytest.raises(ValueError, match="mis-shaped") as info:
        InfinityPipeline.from_pretrained(infinity_copy)
    assert str(config) in str(info.value)


@pytest.mark.parametrize("file", [f"transformer/{WEIGHTS}", f"vae/{WEIGHTS}", "text_encoder/model.safetensors"])
@pytest.mark.parametrize(
    "damage, needle", [("truncate", "truncated"), ("empty", "empty (0 bytes)"), ("garbage", "not a readable")]
)
def test_unreadable_weights_file(infinity_copy, file, damage, needle):
    path = infinity_copy / file
    data = path.read_bytes()
    path.write_bytes(
        {"truncate": data[: len(data) // 2], "empty": b"", "garbage": b"not a safetensors file" * 8}[damage]
    )
    with pytest.raises(CheckpointFileError) as info:
        InfinityPipeline.from_pretrained(infinity_copy)
    assert str(path) in str(info.value) and needle in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "file",
    [
        "model_index.json",
        "transformer/config.json",
        "vae/config.json",
        "text_encoder/config.json",
        "tokenizer/tokenizer.json",
        "tokenizer/tokenizer_config.json",
    ],
)
def test_invalid_json(infinity_copy, file):
    path = infinity_copy / file
    path.write_text(path.read_text()[:-5])
    with pytest.raises(ValueError) as info:
        InfinityPipeline.from_pretrained(infinity_copy)
    assert str(path) in str(info.value) and "JSON" in str(info.value)


@pytest.mark.parametrize(
    "stored, needle",
    [
        ("InfinityPipelin", "did you mean 'InfinityPipeline'"),
        ("FooPipeline", "does not exist"),
        (["pipeline", "InfinityPipelnie"], "does not exist"),
        ("HARTPipeline", "HARTPipeline.from_pretrained"),
    ],
)
def test_model_index_class_name(infinity_copy, stored, needle):
    edit_json(infinity_copy / "model_index.json", lambda index: index.update(_class_name=stored))
    with pytest.raises(ValueError) as info:
        InfinityPipeline.from_pretrained(infinity_copy)
    message = str(info.value)
    assert needle in message and "model_index.json" in message
    if stored != "HARTPipeline":
        assert "InfinityPipeline" in message and "HARTPipeline" in message  # the allowed classes


@pytest.mark.parametrize("component", ["transformer", "vae", "text_encoder"])
def test_missing_component_folder(infinity_copy, component):
    shutil.rmtree(infinity_copy / component)
    with pytest.raises(FileNotFoundError, match=component):
        InfinityPipeline.from_pretrained(infinity_copy)


def test_folder_with_only_model_index(infinity_copy, tmp_path):
    only = tmp_path / "only"
    only.mkdir()
    shutil.copy(infinity_copy / "model_index.json", only)
    with pytest.raises(FileNotFoundError, match="folders are missing") as info:
        InfinityPipeline.from_pretrained(only)
    assert "transformer" in str(info.value) and "vae" in str(info.value)


def test_model_index_that_is_not_utf8(infinity_copy):
    path = infinity_copy / "model_index.json"
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF  # one flipped byte: no longer UTF-8
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointFileError, match="not valid JSON") as info:
        InfinityPipeline.from_pretrained(infinity_copy)
    assert str(path) in str(info.value)


@pytest.fixture(scope="module")
def sharded_infinity(tmp_path_factory):
    """A saved pipeline whose transformer and text encoder are sharded (each with its index)."""
    folder = tmp_path_factory.mktemp("sharded") / "pipe"
    build_tiny_infinity_pipeline(seed=0).save_pretrained(folder, max_shard_size="60KB")
    return folder


@pytest.mark.parametrize(
    "component, index", [("transformer", f"{WEIGHTS}.index.json"), ("text_encoder", "model.safetensors.index.json")]
)
def test_a_shard_index_or_a_shard_that_is_missing(sharded_infinity, tmp_path, component, index):
    folder = Path(shutil.copytree(sharded_infinity, tmp_path / "copy"))
    InfinityPipeline.from_pretrained(folder)  # whole, it loads
    index_path = folder / component / index
    shard = folder / component / sorted(set(json.loads(index_path.read_text())["weight_map"].values()))[-1]
    shard.rename(shard.with_name("moved"))
    with pytest.raises(FileNotFoundError, match="is missing") as info:
        InfinityPipeline.from_pretrained(folder)
    assert str(shard) in str(info.value) and str(index_path) in str(info.value)
    shard.with_name("moved").rename(shard)
    index_path.unlink()  # the shards are there, their index is not
    with pytest.raises(FileNotFoundError, match="is missing") as info:
        InfinityPipeline.from_pretrained(folder)
    assert str(index_path) in str(info.value)


@pytest.mark.parametrize("damage", ["deleted", "not a tokenizer"])
def test_a_tokenizer_file_that_is_missing_or_corrupt(infinity_copy, damage):
    path = infinity_copy / "tokenizer" / "tokenizer.json"
    if damage == "deleted":
        path.unlink()
    else:
        path.write_text(json.dumps({"version": "1.0", "model": {"type": "NoSuchModel"}}))  # valid JSON, no tokenizer
    with pytest.raises((FileNotFoundError, CheckpointFileError)) as info:
        InfinityPipeline.from_pretrained(infinity_copy)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("lie", ["offsets past the data", "a shape larger than its bytes"])
def test_a_safetensors_header_that_lies_about_sizes(infinity_copy, lie):
    import struct

    path = infinity_copy / "vae" / WEIGHTS
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    name = next(k for k in header if k != "__metadata__")
    if lie == "offsets past the data":
        start, end = header[name]["data_offsets"]
        header[name]["data_offsets"] = [start, end + len(data)]
    else:
        header[name]["shape"] = [d * 2 for d in header[name]["shape"]]
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data[8 + length :])
    with pytest.raises(CheckpointFileError, match="not a readable safetensors file") as info:
        InfinityPipeline.from_pretrained(infinity_copy)
    assert str(path) in str(info.value)


def test_hart_folder_with_an_extra_key(saved_hart, tmp_path):
    folder = Path(shutil.copytree(saved_hart, tmp_path / "hart"))
    path = folder / "transformer" / WEIGHTS
    edit_weights(path, lambda sd: sd.update({"stray.bias": torch.zeros(3)}))
    with pytest.raises(ValueError, match="stray.bias") as info:
        HARTPipeline.from_pretrained(folder)
    assert str(path) in str(info.value)
    with pytest.raises(ValueError, match="InfinityPipeline.from_pretrained"):
        HARTPipeline.from_pretrained(saved_infinity_path(tmp_path))


def saved_infinity_path(tmp_path) -> Path:
    folder = tmp_path / "inf"
    build_tiny_infinity_pipeline(seed=0, with_text_encoder=False).save_pretrained(folder)
    return folder


def test_a_model_class_loads_its_folder_strictly(infinity_copy):
    edit_weights(infinity_copy / "vae" / WEIGHTS, lambda sd: sd.update({"extra.weight": torch.zeros(1)}))
    with pytest.raises(ValueError, match="extra.weight"):
        InfinityBSQVAE.from_pretrained(infinity_copy / "vae")
    with pytest.raises(ValueError, match="extra.weight"):
        InfinityBSQVAE.from_pretrained(infinity_copy, subfolder="vae")
    assert isinstance(InfinityTransformer.from_pretrained(infinity_copy / "transformer"), InfinityTransformer)


# ---------------------------------------------------------------------------------------------------------------------
# dtypes
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, dtype",
    [
        ("float16", torch.float16),
        ("bfloat16", torch.bfloat16),
        ("float32", torch.float32),
        ("torch.float16", torch.float16),
        ("torch.bfloat16", torch.bfloat16),
    ],
)
def test_string_dtype_is_honoured(saved_infinity, name, dtype):
    pipe = InfinityPipeline.from_pretrained(saved_infinity, dtype=name)
    assert pipe.transformer.dtype == dtype and pipe.vae.dtype == dtype
    assert resolve_torch_dtype(name) == dtype


@pytest.mark.parametrize("value", ["float17", "int8x", "auto-ish", 16, 1.5])
def test_unknown_dtype_is_refused(saved_infinity, value):
    for key in ("dtype", "torch_dtype"):
        with pytest.raises(ValueError) as info:
            InfinityPipeline.from_pretrained(saved_infinity, **{key: value})
        assert repr(value) in str(info.value) and "float16" in str(info.value)
    with pytest.raises(ValueError, match=repr(value).replace(".", r"\.")):
        InfinityTransformer.from_pretrained(saved_infinity / "transformer", dtype=value)


@pytest.mark.parametrize("key", ["dtype", "torch_dtype"])
def test_dtype_does_not_warn(saved_infinity, recwarn, key):
    """``dtype`` is diffusers 0.42's name; ``torch_dtype`` (deprecated there, warned on every load) is accepted as its
    older name without the warning."""
    pipe = InfinityPipeline.from_pretrained(saved_infinity, **{key: torch.bfloat16})
    assert pipe.transformer.dtype == torch.bfloat16
    assert not [w for w in recwarn if "torch_dtype" in str(w.message)]


def test_dtype_and_torch_dtype_together(saved_infinity):
    with pytest.raises(ValueError, match="not both"):
        InfinityPipeline.from_pretrained(saved_infinity, dtype=torch.float16, torch_dtype=torch.float16)


# ---------------------------------------------------------------------------------------------------------------------
# official checkpoint files
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("source", ["infinity_tiny.pth", "infinity_tiny.safetensors"])
@pytest.mark.parametrize(
    "damage, needle", [("truncate", "truncated"), ("empty", "empty (0 bytes)"), ("garbage", "not a readable")]
)
def test_unreadable_official_checkpoint(tmp_path, source, damage, needle):
    path = tmp_path / source
    data = (FIXTURE_DIR / source).read_bytes()
    path.write_bytes({"truncate": data[: len(data) // 3], "empty": b"", "garbage": b"\x00garbage" * 64}[damage])
    for load in (load_original_state_dict, InfinityTransformer.from_original_checkpoint):
        with pytest.raises(CheckpointFileError) as info:
            load(path)
        assert str(path) in str(info.value) and needle in str(info.value)


def test_a_pickle_that_is_not_a_state_dict(tmp_path):
    path = tmp_path / "list.pth"
    torch.save([torch.zeros(1)], path)
    with pytest.raises(CheckpointFileError, match="list") as info:
        load_original_state_dict(path)
    assert str(path) in str(info.value)


def test_a_malicious_pickle_is_refused_naming_the_file(tmp_path):
    import pickle

    class Evil:
        def __reduce__(self):
            return (print, ("this must not run",))

    path = tmp_path / "evil.pth"
    path.write_bytes(pickle.dumps({"w": Evil()}))
    with pytest.raises(CheckpointFileError, match="weights_only") as info:
        load_original_state_dict(path)
    assert str(path) in str(info.value)


# ---------------------------------------------------------------------------------------------------------------------
# scheduler configurations
# ---------------------------------------------------------------------------------------------------------------------
@pytest.fixture
def lazyvar_folder(tmp_path):
    return Path(shutil.copytree(preset_folder("infinity-2b/lazyvar"), tmp_path / "lazyvar"))


@pytest.mark.parametrize("loader", [VARAccelScheduler, LazyVARScheduler])
@pytest.mark.parametrize(
    "stored, hint",
    [
        ("LazyVARSchedulr", "did you mean 'LazyVARScheduler'"),
        ("FooScheduler", "does not exist"),
        ("", "does not exist"),
    ],
)
def test_scheduler_class_that_does_not_exist(lazyvar_folder, loader, stored, hint):
    edit_json(lazyvar_folder / "acceleration_config.json", lambda c: c.update(_class_name=stored))
    with pytest.raises(ValueError) as info:
        loader.from_pretrained(lazyvar_folder)
    message = str(info.value)
    assert repr(stored) in message and hint in message and "acceleration_config.json" in message
    assert "LazyVARScheduler" in message and "FastVARScheduler" in message  # the allowed classes


def test_scheduler_config_without_a_class_name(lazyvar_folder):
    edit_json(lazyvar_folder / "acceleration_config.json", lambda c: c.pop("_class_name"))
    with pytest.raises(ValueError, match="_class_name"):
        VARAccelScheduler.from_pretrained(lazyvar_folder)
    assert isinstance(LazyVARScheduler.from_pretrained(lazyvar_folder), LazyVARScheduler)  # the class says which


@pytest.mark.parametrize("key", ["keep_ratio", "foo", "prune_ratios"])
def test_scheduler_config_with_an_unknown_key(lazyvar_folder, key):
    edit_json(lazyvar_folder / "acceleration_config.json", lambda c: c.update({key: 0.5}))
    with pytest.raises(ValueError) as info:
        VARAccelScheduler.from_pretrained(lazyvar_folder)
    message = str(info.value)
    assert key in message and "keep_ratios" in message and "acceleration_config.json" in message


def test_pipeline_folder_with_a_bad_acceleration_config(saved_infinity, tmp_path):
    pipe = InfinityPipeline.from_pretrained(saved_infinity)
    pipe.enable_lazyvar()
    folder = tmp_path / "accelerated"
    pipe.save_pretrained(folder)
    edit_json(folder / "acceleration" / "acceleration_config.json", lambda c: c.update(_class_name="LazyVARSchedulr"))
    with pytest.raises(ValueError, match="LazyVARSchedulr"):
        InfinityPipeline.from_pretrained(folder)
    # a bad value of a real setting: the scheduler's message, prefixed with the file that holds it
    edit_json(
        folder / "acceleration" / "acceleration_config.json",
        lambda c: c.update(_class_name="LazyVARScheduler", keep_ratios=[0.2, 0.1, 0.05, 1.5]),
    )
    config = str(folder / "acceleration" / "acceleration_config.json")
    with pytest.raises(ValueError) as info:
        InfinityPipeline.from_pretrained(folder)
    assert config in str(info.value) and "keep_ratios[3]" in str(info.value) and "1.5" in str(info.value)
    # an override that fixes it loads; a bad override is the caller's, not the file's
    assert LazyVARScheduler.from_pretrained(folder / "acceleration", keep_ratios=[0.2, 0.1, 0.05, 0.01])
    edit_json(
        folder / "acceleration" / "acceleration_config.json", lambda c: c.update(keep_ratios=[0.2, 0.1, 0.05, 0.01])
    )
    with pytest.raises(ValueError) as info:
        LazyVARScheduler.from_pretrained(folder / "acceleration", keep_ratios=[0.2, 0.1, 0.05, 2.0])
    assert "acceleration_config.json" not in str(info.value) and "2.0" in str(info.value)


# ---------------------------------------------------------------------------------------------------------------------
# names close to packaged ones
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "typo, suggestion",
    [
        ("embeded", "embedded"),
        ("embedd", "embedded"),
        ("Embedded", "embedded"),
        ("shapes-infinity-tny", "shapes-infinity-tiny"),
    ],
)
def test_typo_of_the_packaged_model(typo, suggestion):
    with pytest.raises(FileNotFoundError) as info:
        InfinityPipeline.from_pretrained(typo)
    assert repr(typo) in str(info.value) and f"did you mean {suggestion!r}" in str(info.value)


@pytest.mark.parametrize(
    "typo, suggestion, error",
    [
        ("infinity-2b/lazyvr", "infinity-2b/lazyvar", ValueError),
        ("hart-0.7b/fastvr", "hart-0.7b/fastvar", ValueError),
        ("infinty-2b/depthvar", "infinity-2b/depthvar", OSError),
        ("lazyvr", "infinity-2b/lazyvar", OSError),
    ],
)
def test_typo_of_a_packaged_preset(offline_hub, typo, suggestion, error):
    with pytest.raises(error) as info:
        VARAccelScheduler.from_pretrained(typo)
    assert typo in str(info.value) and suggestion in str(info.value)


@pytest.mark.parametrize(
    "config, needle",
    [
        ({"_class_name": "LazyVARSchedulr", "keep_ratios": [0.2]}, "did you mean 'LazyVARScheduler'"),
        ({"keep_ratio": [0.2]}, "keep_ratio"),
        ({"keep_ratios": [0.2, 0.1, 0.05, 0.01], "group_scale": [-1]}, "group_scale"),
    ],
)
def test_from_config_is_strict(config, needle):
    with pytest.raises(ValueError) as info:
        LazyVARScheduler.from_config(config)
    assert needle in str(info.value)
    good = LazyVARScheduler.from_preset("infinity")
    assert (
        LazyVARScheduler.from_config(good.config).to_dict() == good.to_dict()
    )  # a scheduler's own config round-trips


def test_composed_member_with_a_misspelt_class():
    from diffusers_var_accel import ComposedScheduler

    with pytest.raises(ValueError, match="did you mean 'FastVARScheduler'"):
        ComposedScheduler([{"_class_name": "FastVARSheduler"}])


def test_a_component_passed_to_from_pretrained_is_not_read_from_the_folder(infinity_copy):
    """Only what is read from the folder is checked: a component given to from_pretrained replaces the stored one."""
    shutil.rmtree(infinity_copy / "text_encoder")
    with pytest.raises(FileNotFoundError, match="text_encoder"):
        InfinityPipeline.from_pretrained(infinity_copy)
    pipe = InfinityPipeline.from_pretrained(infinity_copy, text_encoder=None, tokenizer=None)
    assert pipe.text_encoder is None and isinstance(pipe.transformer, InfinityTransformer)


def test_a_subclass_loads_the_folder_of_its_base_class(saved_infinity):
    class MyInfinityPipeline(InfinityPipeline):
        pass

    assert isinstance(MyInfinityPipeline.from_pretrained(saved_infinity), MyInfinityPipeline)


def test_loading_writes_no_nested_progress_bar_escapes(capfd):
    """Only diffusers' "Loading pipeline components" bar: transformers' bar nested in it would write cursor-up escapes
    (``\\x1b[A``) into every log; and transformers' bars are on again afterwards."""
    from transformers.utils import logging as transformers_logging

    from diffusers_var_accel import InfinityPipeline

    InfinityPipeline.from_pretrained("embedded")
    err = capfd.readouterr().err
    assert "\x1b[A" not in err and "Loading weights" not in err
    assert transformers_logging.is_progress_bar_enabled()
