"""The ``var-accel convert <family>`` sub-commands: each family's converter options and call (the conversion itself
lives beside its pipeline, ``pipelines/<family>/convert.py``).

The options are written here, without torch, so that ``var-accel convert <family> --help`` answers before torch is
imported; each converter is imported when it runs. ``tests/lab/test_cli_startup.py`` checks that these options
equal the library's ``add_convert_arguments`` of each family.
"""

import argparse
from typing import Any

from diffusers_var_accel.lab.families import ConvertCommand

#: Infinity's named transformer configs (``INFINITY_CONFIGS``' keys), ``--config``'s choices.
INFINITY_CONFIG_NAMES = ("infinity-2b", "infinity-8b")


def add_infinity_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``var-accel convert infinity``: the official checkpoint files."""
    parser.add_argument(
        "--transformer",
        required=True,
        help="official transformer .pth (plain state dict, e.g. "
        "infinity_2b_reg.pth), a .safetensors copy with the official keys, or the 8B shard folder "
        "(infinity_8b_weights/ with model.safetensors.index.json)",
    )
    parser.add_argument(
        "--vae",
        required=True,
        help="official VAE .pth (e.g. infinity_vae_d32reg.pth, "
        "infinity_vae_d56_f8_14_patchify.pth for 8B) or .safetensors",
    )
    parser.add_argument(
        "--config", choices=INFINITY_CONFIG_NAMES, help="named config (default: inferred from the shapes)"
    )


def convert_infinity(args: argparse.Namespace, torch_dtype: Any) -> Any:
    """``pipelines/infinity/convert.py``'s ``convert_from_arguments`` (imported here: it imports torch)."""
    from diffusers_var_accel.pipelines.infinity.convert import convert_from_arguments

    return convert_from_arguments(args, torch_dtype)


def add_hart_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``var-accel convert hart``: the official folder and which of its weights."""
    parser.add_argument(
        "--checkpoint", required=True, help="official HART folder (with llm/ and tokenizer/) or its llm/ folder"
    )
    parser.add_argument("--no-ema", action="store_true", help="use the main weights instead of llm/ema_model.bin")


def convert_hart(args: argparse.Namespace, torch_dtype: Any) -> Any:
    """``pipelines/hart/convert.py``'s ``convert_from_arguments`` (imported here: it imports torch)."""
    from diffusers_var_accel.pipelines.hart.convert import convert_from_arguments

    return convert_from_arguments(args, torch_dtype)


INFINITY_CONVERT = ConvertCommand(
    help="Infinity: transformer .pth + VAE .pth (+ a local T5 folder)",
    description="Convert the official Infinity transformer and VAE checkpoints.",
    add_arguments=add_infinity_arguments,
    convert=convert_infinity,
)

HART_CONVERT = ConvertCommand(
    help="HART: the official folder (llm/ + tokenizer/) (+ a local Qwen2 folder)",
    description="Convert the official HART folder (hart-0.7b-1024px/: llm/ and tokenizer/).",
    add_arguments=add_hart_arguments,
    convert=convert_hart,
)
