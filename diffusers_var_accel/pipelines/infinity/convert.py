"""Official Infinity checkpoints -> an :class:`InfinityPipeline` (and, through ``save_pretrained``, a diffusers folder).

The command-line wrapper is ``scripts/convert_infinity_original.py``. Loading is strict: a checkpoint whose keys or
shapes do not match the model raises a ``ValueError`` that lists every offending key.

Examples:
    ```py
    >>> import torch
    >>> from diffusers_var_accel.pipelines.infinity.convert import convert_infinity_original

    >>> pipe = convert_infinity_original(
    ...     "weights/infinity_2b_reg.pth", "weights/infinity_vae_d32reg.pth", text_encoder_path="weights/flan-t5-xl",
    ...     config="infinity-2b", torch_dtype=torch.bfloat16,
    ... )
    >>> pipe.save_pretrained("infinity-2b-diffusers")
    ```
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Optional, Union

import torch

from ...models.autoencoder_bsq import InfinityBSQVAE
from ...models.checkpoint_utils import SHARDED_INDEX_NAME, resolve_torch_dtype
from ...models.transformer_infinity import INFINITY_CONFIGS, InfinityTransformer
from .pipeline_infinity import InfinityPipeline, check_token_layout

PathLike = Union[str, os.PathLike]


def convert_infinity_original(
    transformer_path: PathLike,
    vae_path: PathLike,
    text_encoder_path: Optional[PathLike] = None,
    tokenizer_path: Optional[PathLike] = None,
    config: Optional[str] = None,
    torch_dtype: Optional[torch.dtype] = None,
) -> InfinityPipeline:
    """Build an :class:`InfinityPipeline` from the official checkpoint files, loading every weight strictly.

    Args:
        transformer_path (`str` or `os.PathLike`): the official transformer (``infinity_2b_reg.pth``, a plain state
            dict read with ``torch.load(..., weights_only=True)``), a ``.safetensors`` copy with the same keys, or the
            released 8B sharded folder (``infinity_8b_weights/``: ``model.safetensors.index.json`` + shards, loaded
            shard by shard).
        vae_path (`str` or `os.PathLike`): the official VAE (``.pth`` holding ``{'vae': state_dict}`` or a plain state
            dict, wrapped or plain key names), or a ``.safetensors`` copy; its config is read from the shapes (the
            d32 VAE of 2B, the patch-8 ``infinity_vae_d56_f8_14_patchify.pth`` of 8B). A transformer that predicts
            4x the VAE's bits per token is the spatial-patchify (8B) path.
        text_encoder_path (`str` or `os.PathLike`, *optional*): a local folder of a transformers T5 encoder (e.g.
            flan-t5-xl), loaded with ``T5EncoderModel.from_pretrained`` offline. Without it the pipeline has no text
            encoder and runs from ``prompt_embeds``.
        tokenizer_path (`str` or `os.PathLike`, *optional*): a local tokenizer folder; defaults to
            ``text_encoder_path``. Ignored without a text encoder.
        config (`str`, *optional*): a name from ``INFINITY_CONFIGS`` (``"infinity-2b"``, ``"infinity-8b"``); inferred
            from the transformer's tensor shapes when omitted.
        torch_dtype (`torch.dtype`, *optional*): cast every component to this dtype (float32 when omitted).

    Returns:
        [`InfinityPipeline`]: the assembled pipeline, on the CPU, in eval mode.

    Raises:
        ValueError: an unknown config name; checkpoint keys or shapes that do not match (all listed); a corrupt shard
            (named); components that do not fit together (text width, bits per token).
        FileNotFoundError: a checkpoint file or folder that does not exist.
    """
    if config is not None and config not in INFINITY_CONFIGS:
        raise ValueError(
            f"unknown Infinity config {config!r}; known: {sorted(INFINITY_CONFIGS)} (or omit it to infer)"
        )
    torch_dtype = resolve_torch_dtype(torch_dtype)
    transformer_path = os.fspath(transformer_path)
    if not (os.path.isfile(transformer_path) or os.path.isdir(transformer_path)):
        raise FileNotFoundError(
            f"transformer checkpoint not found: {transformer_path} (a file, or a sharded folder "
            f"with {SHARDED_INDEX_NAME})"
        )
    if not os.path.isfile(os.fspath(vae_path)):
        raise FileNotFoundError(f"vae checkpoint not found: {os.fspath(vae_path)}")

    # 1. VAE, then the transformer, strictly. The transformer's shapes cannot tell the official 8B flag
    #    apply_spatial_patchify; with an inferred config it follows from the VAE: 4x its bits per token is a 2x2 patch.
    vae = InfinityBSQVAE.from_original_checkpoint(os.fspath(vae_path), torch_dtype=torch_dtype)
    transformer = InfinityTransformer.from_original_checkpoint(
        transformer_path, config=config, torch_dtype=torch_dtype
    )
    if config is None and transformer.config.codebook_dim == 4 * vae.config.codebook_dim:
        transformer.register_to_config(apply_spatial_patchify=True)  # the flag only changes the token layout
    check_token_layout(transformer, vae)

    # 2. Text encoder and tokenizer (optional)
    text_encoder = tokenizer = None
    if text_encoder_path is not None:
        from transformers import AutoTokenizer, T5EncoderModel

        text_encoder_path = os.fspath(text_encoder_path)
        tokenizer_path = os.fspath(tokenizer_path) if tokenizer_path is not None else text_encoder_path
        for name, path in (("text encoder", text_encoder_path), ("tokenizer", tokenizer_path)):
            if not os.path.isdir(path):
                raise FileNotFoundError(f"{name} folder not found: {path} (a local transformers folder is expected)")
        kwargs = {"local_files_only": True}
        if torch_dtype is not None:
            kwargs["dtype"] = torch_dtype
        text_encoder = T5EncoderModel.from_pretrained(text_encoder_path, **kwargs).eval()
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_path, local_files_only=True)
        if text_encoder.config.d_model != transformer.config.text_channels:
            raise ValueError(
                f"the text encoder writes {text_encoder.config.d_model}-channel features but the transformer expects "
                f"text_channels={transformer.config.text_channels}; pass the T5 encoder the model was trained with"
            )

    return InfinityPipeline(transformer=transformer, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer)


# ---------------------------------------------------------------------------------------------------------------------
# the command line: ``var-accel convert infinity`` (the shared options and the saving are the CLI's)
# ---------------------------------------------------------------------------------------------------------------------
def add_convert_arguments(parser: argparse.ArgumentParser) -> None:
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
        "--config", choices=tuple(INFINITY_CONFIGS), help="named config (default: inferred from the shapes)"
    )


def convert_from_arguments(args: argparse.Namespace, torch_dtype: torch.dtype) -> InfinityPipeline:
    """``var-accel convert infinity``: the pipeline of ``args.transformer`` / ``args.vae`` (+ ``args.text_encoder``,
    ``args.tokenizer``)."""
    for flag, value in (("--transformer", args.transformer), ("--vae", args.vae)):
        if not (Path(value).is_file() or (flag == "--transformer" and Path(value).is_dir())):
            raise FileNotFoundError(
                f"{flag} {value}: no such file; give the official checkpoint file "
                "(infinity_2b_reg.pth / infinity_vae_d32reg.pth or .safetensors copies; "
                "for 8B the infinity_8b_weights/ shard folder)"
            )
    return convert_infinity_original(
        args.transformer,
        args.vae,
        text_encoder_path=args.text_encoder,
        tokenizer_path=args.tokenizer,
        config=args.config,
        torch_dtype=torch_dtype,
    )


#: The ``var-accel convert infinity`` sub-command (registered as the family's ``converter``).
