"""Time of one generation of the embedded model with diffusers' group offload against none, side by side.

    python scripts/time_group_offload.py [--repeats 5] [--accel lazyvar]

Four pipelines (none, block level to memory, block level to disk, leaf level to disk, text encoder excluded there as
the pipeline requires) generate in turn, ``--repeats`` rounds; the table gives each one's median seconds and its
ratio to no offload. On the CPU an offload to memory moves nothing (the onload device is the offload device): its
ratio is the hooks' own cost; a disk offload writes once and reads every group back from disk at each use.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from diffusers_var_accel.embedded import EMBEDDED_SAMPLING
from diffusers_var_accel.pipelines.pipeline_loading import load_embedded_pipeline

SETTINGS = {
    "none": None,
    "group, block level, memory": {"offload_type": "block_level", "num_blocks_per_group": 1},
    "group, block level, disk": {"offload_type": "block_level", "num_blocks_per_group": 1, "disk": True},
    "group, leaf level, disk": {"offload_type": "leaf_level", "disk": True, "exclude_modules": ["text_encoder"]},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--accel", default="lazyvar")
    args = parser.parse_args()
    torch.set_num_threads(1)
    folder = tempfile.TemporaryDirectory()
    pipes = {}
    for name, setting in SETTINGS.items():
        pipe = load_embedded_pipeline()
        pipe.set_progress_bar_config(disable=True)
        if setting is not None:
            setting = dict(setting)
            if setting.pop("disk", False):
                setting["offload_to_disk_path"] = tempfile.mkdtemp(dir=folder.name)
            pipe.enable_group_offload(torch.device("cpu"), **setting)
        pipes[name] = pipe
    seconds = {name: [] for name in pipes}
    for _ in range(args.repeats + 1):  # the first round warms up (and writes the disk files)
        for name, pipe in pipes.items():
            start = time.perf_counter()
            pipe("a red fox", generator=torch.Generator().manual_seed(0), acceleration=args.accel, **EMBEDDED_SAMPLING)
            seconds[name].append(time.perf_counter() - start)
    base = statistics.median(seconds["none"][1:])
    print(f"| offload ({args.accel}, embedded model, CPU, 1 thread) | median s | ratio to none |")
    print("| --- | ---: | ---: |")
    for name, times in seconds.items():
        median = statistics.median(times[1:])
        print(f"| {name} | {median:.3f} | {median / base:.2f} |")


if __name__ == "__main__":
    main()
