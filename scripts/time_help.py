"""Median wall time of ``var-accel ... --help`` for every command the parser has, each in a fresh process, beside
``python -c "import torch"`` (docs/cli.md, "--help without torch"). Usage: ``python scripts/time_help.py [--runs 5]``.
"""

import argparse
import statistics
import subprocess
import sys
import time
from typing import List


def _median_seconds(argv: List[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    from diffusers_var_accel.lab.cli import build_parser, command_paths

    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("--runs", type=int, default=5, help="runs per command (default 5)")
    runs = cli.parse_args().runs
    print("| command | median s |\n| --- | ---: |")
    print(f'| `python -c "import torch"` | {_median_seconds([sys.executable, "-c", "import torch"], runs):.2f} |')
    for path in [[]] + command_paths(build_parser([])):
        seconds = _median_seconds([sys.executable, "-m", "diffusers_var_accel", *path, "--help"], runs)
        print(f"| `var-accel {' '.join([*path, '--help'])}` | {seconds:.2f} |", flush=True)


if __name__ == "__main__":
    main()
