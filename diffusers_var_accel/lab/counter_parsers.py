"""The command lines of the three counters (``var-accel flops``, ``launches``, ``memory``), built without torch.

Each counter lives beside its torch code (:mod:`diffusers_var_accel.lab.bench.flops`, ``.launches``, ``.memory``)
and parses its arguments with the parser built here, from the families' :class:`~diffusers_var_accel.lab.families.
CounterOptions` and the built-in method names: so ``var-accel flops --help`` and a mistyped flag answer before
torch is imported (the command line parses first, then imports the counter). ``tests/lab/test_cli_startup.py``
checks that these choices equal the torch-side registries' (the FLOP meter's models, the launch structures, the
memory modules).
"""

from __future__ import annotations

import argparse
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from diffusers_var_accel.builtin_methods import BUILTIN_METHODS
from diffusers_var_accel.lab.families import CounterOptions, LabFamily, lab_families
from diffusers_var_accel.lab.user_errors import positive_int_argument

#: ``var-accel memory --weights``: the transformer's (and text encoder's) linear weights as stored.
WEIGHT_FORMS = ("none", "int8", "float8")
#: ``var-accel memory --offload``: none, ``enable_model_cpu_offload``, ``enable_group_offload`` at block or leaf level.
OFFLOAD_MODES = ("none", "model", "group-block", "group-leaf")
#: ``var-accel memory --kv``: the KV cache in the attention's dtype, or in int8 (``pipe.enable_kv_cache_quantization``).
KV_FORMS = ("none", "int8")
#: The weight dtypes the launch counter and the memory meter take, by name.
DTYPE_NAMES = ("bfloat16", "float16", "float32")

FLOPS_DESCRIPTION = (
    "FLOPs of one Infinity or HART text-to-image generation, counted on the real code path without allocating any "
    "weight."
)
LAUNCHES_DESCRIPTION = "Kernel launches and host-device syncs of one Infinity or HART generation, counted on the CPU."
MEMORY_DESCRIPTION = (
    "Peak device memory of one Infinity or HART generation, counted at the real structure without any weight."
)


def _families() -> List[Tuple[LabFamily, CounterOptions]]:
    return [(family, family.counter_options) for family in lab_families() if family.counter_options is not None]


def knows_every_family() -> bool:
    """Whether every registered family with a counter part has its :class:`CounterOptions` (a plugin family may
    have counters only: then the torch-free parsers would refuse its models, and the counter parses alone)."""
    return all(
        family.counter_options is not None
        for family in lab_families()
        if family.flop_breakdown or family.launch_structures
    )


def flop_models() -> List[str]:
    """The FLOP meter's ``--model`` choices, each family's sorted, in registration order."""
    return [model for _, options in _families() for model in sorted(options.flop_models)]


def launch_models() -> List[str]:
    """The launch counter's ``--models`` names, in registration order."""
    return [model for _, options in _families() for model in options.launch_models]


def launch_default_models() -> Tuple[str, ...]:
    """The models ``var-accel launches`` counts by default (each family's defaults)."""
    return tuple(model for _, options in _families() for model in options.launch_default_models)


def memory_models() -> List[str]:
    """The memory meter's ``--model`` choices, in registration order."""
    return [model for _, options in _families() for model in options.memory_models]


def flops_parser(prog: Optional[str] = None, models: Optional[Sequence[str]] = None) -> argparse.ArgumentParser:
    """``var-accel flops``' parser (:func:`diffusers_var_accel.lab.bench.flops.main` parses with it, passing the FLOP
    meter's ``models``; default: the families' :class:`CounterOptions`)."""
    families = [(family, options) for family, options in _families() if options.flop_models]
    parser = argparse.ArgumentParser(
        prog=prog,
        allow_abbrev=False,
        description=FLOPS_DESCRIPTION,
        epilog="examples:\n  var-accel flops --model infinity-2b\n  var-accel flops --model hart-0.7b --accel fastvar lazyvar",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", default=families[0][0].preset_model, choices=list(models or flop_models()))
    size_help = "; ".join(options.size_help for _, options in families if options.size_help)
    parser.add_argument("--height", type=int, default=None, help=f"image height ({size_help})")
    parser.add_argument("--width", type=int, default=None, help=f"image width ({size_help})")
    parser.add_argument("--batch-size", type=int, default=1)
    tokens_help = "; ".join(options.text_tokens_help for _, options in families if options.text_tokens_help)
    parser.add_argument("--text-tokens", type=int, default=None, help=tokens_help)
    parser.add_argument("--no-cfg", action="store_true", help="no guidance: only the conditional rows run")
    for _, options in families:
        if options.text_encoder is not None:
            name, help_text = options.text_encoder
            parser.add_argument(f"--{name}-tokens", type=int, default=0, help=help_text)
    parser.add_argument(
        "--accel",
        nargs="+",
        default=None,
        help="acceleration methods to compare with the baseline, separated by spaces or commas "
        f"({', '.join(BUILTIN_METHODS)}, a+b compositions, name:key=value, a config folder)",
    )
    titles = [family.title or family.name for family, options in families if options.conventions]
    parser.add_argument(
        "--conventions",
        action="store_true",
        help=f"{' and '.join(titles)}: totals of the baseline and the --accel methods under several counting "
        "conventions",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument(
        "--memory",
        action="store_true",
        help="also count each row's peak device memory (var-accel memory's meter, bf16 weights, the same model, "
        "size, batch, CFG and acceleration; a second run on the meta device): peak_bytes in the JSON rows",
    )
    parser.add_argument(
        "--debug", action="store_true", help="show the Python traceback of an error instead of its one-line message"
    )
    return parser


def launches_parser(
    prog: Optional[str] = None, models: Optional[Sequence[str]] = None, default_models: Optional[Sequence[str]] = None
) -> argparse.ArgumentParser:
    """``var-accel launches``' parser (:func:`diffusers_var_accel.lab.bench.launches.main` parses with it, passing the
    launch structures' ``models`` and ``default_models``; default: the families' :class:`CounterOptions`)."""
    defaults = ",".join(default_models or launch_default_models())
    parser = argparse.ArgumentParser(
        prog=prog,
        description=LAUNCHES_DESCRIPTION,
        epilog="Convention and window: see the module docstring (docs/benchmarks.md).",
    )
    parser.add_argument(
        "--models",
        default=defaults,
        help=f"comma-separated: {', '.join(models or launch_models())} (default {defaults})",
    )
    parser.add_argument(
        "--methods",
        default=None,
        help="comma-separated specs: baseline, method presets, name:key=value, a+b (default: baseline and "
        "every registered method)",
    )
    parser.add_argument(
        "--dtype",
        default="bfloat16",
        help="comma-separated weight dtypes: bfloat16 (default; autocast as on a GPU), float32, float16",
    )
    parser.add_argument(
        "--depth", type=positive_int_argument, default=None, help="transformer blocks (default: the real depth)"
    )
    parser.add_argument("--size", type=positive_int_argument, default=1024, help="Infinity image side (default 1024)")
    for _, options in _families():  # each family's own options (HART's --hart-scales)
        for flag, help_text in options.launch_arguments:
            parser.add_argument(flag, type=positive_int_argument, default=None, help=help_text)
    parser.add_argument("--batch-size", type=positive_int_argument, default=1, help="images per call (default 1)")
    parser.add_argument("--no-cfg", action="store_true", help="no guidance (default: CFG on)")
    parser.add_argument("--per-scale", action="store_true", help="also print kernels/syncs per scale")
    parser.add_argument("--block-ops", action="store_true", help="also list the kernel ops of one dense block")
    parser.add_argument("--syncs", action="store_true", help="also list every sync with its source line and count")
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object (every record) instead of the table"
    )
    parser.add_argument(
        "--no-warmup",
        action="store_true",
        help="count the first call (default: a warm-up call first, its syncs in 'syncs (first call)')",
    )
    parser.add_argument(
        "--debug", action="store_true", help="show the Python traceback of an error instead of its one-line message"
    )
    return parser


def memory_parser(prog: Optional[str] = None, models: Optional[Sequence[str]] = None) -> argparse.ArgumentParser:
    """``var-accel memory``' parser (:func:`diffusers_var_accel.lab.bench.memory.main` parses with it, passing the
    memory modules' ``models``; default: the families' :class:`CounterOptions`)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=MEMORY_DESCRIPTION,
        epilog="What is counted and left out: the module docstring (docs/memory.md).",
    )
    parser.add_argument("--model", required=True, choices=tuple(models or memory_models()))
    parser.add_argument("--accel", default=None, help="an acceleration spec (default: the baseline)")
    parser.add_argument("--height", type=int, default=1024)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--no-cfg", action="store_true", help="no guidance (default: CFG on)")
    parser.add_argument("--dtype", default=None, choices=DTYPE_NAMES, help="weights' dtype (default bfloat16)")
    parser.add_argument("--weights", default=None, choices=WEIGHT_FORMS, help="linear weights as stored")
    parser.add_argument("--offload", default=None, choices=OFFLOAD_MODES)
    parser.add_argument("--streams", action="store_true", default=None, help="group offload prefetches a group")
    parser.add_argument("--tiling", action="store_true", default=None, help="tiled decoding (vae.enable_tiling)")
    parser.add_argument("--kv", default=None, choices=KV_FORMS, help="the KV cache's storage (default: none)")
    parser.add_argument("--text-tokens", type=int, default=None, help="tokens per prompt through the text encoder")
    parser.add_argument("--json", metavar="FILE", default=None, help="also write the rows to FILE as JSON")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    return parser


#: ``{command: its parser builder}`` of the counters that parse their own arguments.
COUNTER_PARSERS: Dict[str, Callable[[Optional[str]], argparse.ArgumentParser]] = {
    "flops": flops_parser,
    "launches": launches_parser,
    "memory": memory_parser,
}
