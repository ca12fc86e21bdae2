#!/usr/bin/env python
"""Which tokens the methods keep with the int8 KV cache against the float one (docs/memory.md, "The int8 KV cache").

On the test suite's tiny models, every method of ``tests/library/test_kv_cache_int8.py`` runs twice with the same
teacher-forced tokens (the test's ``run``): float KV cache, then int8. Prints per method the routes with fixed
positions, how many are identical, and the overlap of the kept positions (int8 vs float).

    python scripts/kv_int8_route_overlap.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "library")]


def main() -> int:
    from _pytest.monkeypatch import MonkeyPatch
    from conftest import tiny_hart_patch_nums

    import test_kv_cache_int8 as cases
    from diffusers_var_accel.pipelines.hart.tiny import build_tiny_hart_pipeline
    from diffusers_var_accel.pipelines.infinity.tiny import build_tiny_infinity_pipeline

    pipes = {
        "infinity": build_tiny_infinity_pipeline(seed=0, depth=6),
        "hart": build_tiny_hart_pipeline(
            seed=0, depth=4, embed_dim=32, patch_nums=tiny_hart_patch_nums(), tokenizer_ch_mult=(1,)
        ),
    }
    print("| method | family | routes with positions | identical | overlap of kept positions |")
    print("| --- | --- | ---: | ---: | ---: |")
    for method, family in cases.CASES:
        if method is None:
            continue
        pipe = pipes[family]
        pipe.set_progress_bar_config(disable=True)
        teacher = cases.teacher_for(pipe, family)
        runs = []
        for kv in (None, "int8"):
            if kv is None:
                pipe.disable_kv_cache_quantization()
            else:
                pipe.enable_kv_cache_quantization(kv)
            runs.append(cases.run(pipe, family, method, teacher, MonkeyPatch())[1])
        pipe.disable_kv_cache_quantization()
        indexed = identical = kept = shared = 0
        for (_, full), (_, quant) in zip(*runs):
            if full is None:
                continue
            indexed += 1
            identical += int(bool((full == quant).all()))
            for row_full, row_quant in zip(full, quant):
                kept += len(row_full)
                shared += len(set(row_full.tolist()) & set(row_quant.tolist()))
        overlap = f"{shared / kept:.1%}" if kept else "-"
        print(f"| {method} | {family} | {indexed} | {identical} | {overlap} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
