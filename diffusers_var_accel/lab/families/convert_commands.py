"""The ``var-accel convert <family>`` sub-commands: each family's converter options and call (the conversion itself
lives beside its pipeline, ``pipelines/<family>/convert.py``)."""

from diffusers_var_accel.lab.families import ConvertCommand
from diffusers_var_accel.pipelines.hart import convert as hart_convert
from diffusers_var_accel.pipelines.infinity import convert as infinity_convert

INFINITY_CONVERT = ConvertCommand(
    help="Infinity: transformer .pth + VAE .pth (+ a local T5 folder)",
    description="Convert the official Infinity transformer and VAE checkpoints.",
    add_arguments=infinity_convert.add_convert_arguments,
    convert=infinity_convert.convert_from_arguments,
)

HART_CONVERT = ConvertCommand(
    help="HART: the official folder (llm/ + tokenizer/) (+ a local Qwen2 folder)",
    description="Convert the official HART folder (hart-0.7b-1024px/: llm/ and tokenizer/).",
    add_arguments=hart_convert.add_convert_arguments,
    convert=hart_convert.convert_from_arguments,
)
