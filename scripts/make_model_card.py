#!/usr/bin/env python
"""Write the model card (README.md) of a converted Infinity / HART pipeline folder, and its Hub pipeline.py shim.

The card has YAML metadata (library_name, pipeline_tag text-to-image, tags with the acceleration methods, license,
base_model, the acceleration presets and measured numbers), a usage snippet, the presets of the model's family, the
numbers of a benchmark results.json (optional) and the components. The logic is
diffusers_var_accel.lab.cards.write_model_card; fields read from results.json: see docs/presets_and_hub.md.

Example:

    python scripts/make_model_card.py infinity-2b-diffusers --repo-id my-org/infinity-2b-var-accel \\
        --results bench_outputs/results.json --license mit --base-model FoundationVision/Infinity \\
        --calibration calibrated/lazyvar
    huggingface-cli upload my-org/infinity-2b-var-accel infinity-2b-diffusers .
"""

import argparse
import sys


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("folder", help="a converted pipeline folder (with model_index.json)")
    parser.add_argument("--results", help="a benchmark results.json (var-accel bench) whose numbers go into the card")
    parser.add_argument("--repo-id", help="the Hub repo id used in the snippets (default: the folder's name)")
    parser.add_argument("--license", help="a Hub license id, e.g. mit, apache-2.0, other (default: none written)")
    parser.add_argument("--base-model", help="the Hub id of the original model (metadata base_model)")
    parser.add_argument("--model-name", help="the card's title (default: the folder's name)")
    parser.add_argument("--tag", action="append", default=[], help="an extra tag (repeatable)")
    parser.add_argument(
        "--no-shim",
        action="store_true",
        help="do not write the pipeline.py shim (and remove ours if present); DiffusionPipeline.from_pretrained "
        "then cannot load the repo, InfinityPipeline/HARTPipeline.from_pretrained can without trust_remote_code",
    )
    parser.add_argument(
        "--calibration",
        action="append",
        default=[],
        metavar="DIR",
        help="a var-accel calibrate output folder (repeatable): its chosen setting is copied to "
        "<folder>/<method>/ and tabled in the card",
    )
    parser.add_argument(
        "--prompt",
        help="the prompt of the card's usage snippets (default: a shapes prompt for a copy of "
        "the embedded model, else 'a red fox in the snow')",
    )
    parser.add_argument(
        "--copy-presets",
        action="store_true",
        help="also write the family's presets as <folder>/<method>/acceleration_config.json",
    )
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from diffusers_var_accel.lab.cards import write_model_card

    try:
        path = write_model_card(
            args.folder,
            results=args.results,
            shim=not args.no_shim,
            copy_presets=args.copy_presets,
            calibrations=args.calibration,
            repo_id=args.repo_id,
            license=args.license,
            base_model=args.base_model,
            model_name=args.model_name,
            tags=args.tag,
            example_prompt=args.prompt,
        )
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {path}" + ("" if args.no_shim else " and the pipeline.py shim"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
