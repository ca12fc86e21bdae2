#!/usr/bin/env python
"""Host memory of loading a converted Infinity transformer folder (docs/memory.md, "Loading").

Writes a folder of the real structure (``--model``, bf16, all-zero weights: ``save_pretrained`` of the model built on
the meta device and materialised empty) unless it exists, then, in this process, loads it with
``InfinityTransformer.from_pretrained(folder, torch_dtype=torch.bfloat16)``, reads every byte of every weight (a
memory-mapped page counts once it is read) and prints the process's peak resident memory above what it held before
the load, against the folder's size.

    python scripts/measure_load_peak.py --folder /tmp/infinity-2b-transformer [--model infinity-2b]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
from pathlib import Path

import torch


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status (Linux only)")


def _make_folder(model: str, folder: Path) -> None:
    from diffusers_var_accel.lab.bench.flop_meter import build_on_meta
    from diffusers_var_accel.models.transformer_infinity import INFINITY_CONFIGS, InfinityTransformer

    transformer = (
        build_on_meta(InfinityTransformer, **INFINITY_CONFIGS[model]).to(torch.bfloat16).to_empty(device="cpu")
    )
    with torch.no_grad():
        for tensor in (*transformer.parameters(), *transformer.buffers()):
            tensor.zero_()
    transformer.save_pretrained(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--model", default="infinity-2b", choices=("infinity-2b", "infinity-8b"))
    parser.add_argument("--make-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.make_only:
        _make_folder(args.model, args.folder)
        return
    if not (args.folder / "config.json").is_file():  # written by a child: its memory is not this process's peak
        subprocess.run(
            [sys.executable, __file__, "--folder", str(args.folder), "--model", args.model, "--make-only"], check=True
        )
    from diffusers_var_accel.models.transformer_infinity import InfinityTransformer

    size = sum(f.stat().st_size for f in args.folder.iterdir() if f.is_file())
    before = _rss_bytes()
    transformer = InfinityTransformer.from_pretrained(args.folder, torch_dtype=torch.bfloat16)
    with torch.no_grad():
        for tensor in (*transformer.parameters(), *transformer.buffers()):
            tensor.reshape(-1).view(torch.uint8).max()  # read every byte, no copy
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    print(
        f"folder {size / 1e9:.2f} GB; peak resident above the start {(peak - before) / 1e9:.2f} GB = "
        f"{(peak - before) / size:.2f}x the folder (now {(_rss_bytes() - before) / 1e9:.2f} GB); pid {os.getpid()}"
    )


if __name__ == "__main__":
    main()
