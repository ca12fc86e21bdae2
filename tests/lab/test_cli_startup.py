"""``var-accel --help`` and every command's ``--help`` answer without importing torch or diffusers (the parser is
built from light modules; each command imports what it runs); a mistyped option names the close one."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "diffusers", "transformers")


def test_the_commands_are_read_from_the_parser():
    from diffusers_var_accel.lab.cli import build_parser, command_paths

    commands = command_paths(build_parser([]))
    names = {" ".join(path) for path in commands}
    assert {"generate", "demo", "serve", "bench", "calibrate", "flops", "launches", "memory"} <= names
    assert {"convert infinity", "convert hart"} <= names


def test_every_help_imports_neither_torch_nor_diffusers():
    from diffusers_var_accel.lab.cli import build_parser, command_paths

    commands = command_paths(build_parser([]))
    code = (
        "import contextlib, io, json, runpy, sys\n"
        f"heavy = {HEAVY!r}\n"
        "codes = []\n"
        "for argv in [['--help']] + [[*c, '--help'] for c in " + repr(commands) + "]:\n"
        "    sys.argv = ['var-accel', *argv]\n"
        "    with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "        try:\n"
        "            runpy.run_module('diffusers_var_accel', run_name='__main__', alter_sys=True)\n"
        "        except SystemExit as exit_:\n"
        "            codes.append((exit_.code, len(out.getvalue())))\n"
        "print(json.dumps({'codes': codes, 'heavy': [m for m in heavy if m in sys.modules]}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["heavy"] == []
    assert len(seen["codes"]) == 1 + len(commands)
    assert all(code == 0 and printed > 200 for code, printed in seen["codes"]), seen["codes"]


@pytest.mark.parametrize("command", ["flops", "memory"])
def test_a_counters_bad_flag_is_one_line_before_torch(command):
    """A mistyped flag of a counter is refused by its torch-free parser: one ``error:`` line, torch never imported."""
    code = (
        "import sys\n"
        "from diffusers_var_accel.lab.cli import main\n"
        f"code = main([{command!r}, '--model', 'infinity-2b', '--no-such-flag'])\n"
        "print(code, [m for m in " + repr(HEAVY) + " if m in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.stdout.strip().splitlines()[-1] == "2 []", (done.stdout, done.stderr)
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "--no-such-flag" in errors[0], done.stderr


def test_the_counters_torch_free_choices_equal_the_torch_side_registries():
    """The families' ``CounterOptions`` (read by ``--help``) say what the counters' torch code knows."""
    import argparse as argparse_

    from diffusers_var_accel.lab import counter_parsers
    from diffusers_var_accel.lab.bench import launches, memory
    from diffusers_var_accel.lab.bench.flop_meter import family_flops, model_choices
    from diffusers_var_accel.lab.families import lab_family
    from diffusers_var_accel.schedulers.registry import method_names

    assert counter_parsers.knows_every_family()
    assert counter_parsers.flop_models() == model_choices()
    assert counter_parsers.launch_models() == list(launches._known_models())
    assert counter_parsers.launch_default_models() == launches.DEFAULT_MODELS
    assert counter_parsers.memory_models() == list(memory._family_memory())
    assert counter_parsers.DTYPE_NAMES == tuple(memory._DTYPES)
    assert set(counter_parsers.DTYPE_NAMES) == set(launches._DTYPES)
    for name, spec in family_flops().items():
        options = lab_family(name).counter_options
        assert set(options.flop_models) == set(spec.models)
        assert (options.size_help, options.text_tokens_help) == (spec.cli_help["size"], spec.cli_help["text_tokens"])
        assert (options.text_encoder, options.conventions) == (spec.text_encoder, spec.conventions)
    for structures in launches._families_structures():  # each family's own launch options, flag and help
        torch_side = argparse_.ArgumentParser()
        structures.add_arguments(torch_side)
        own = [(a.option_strings[0], a.help) for a in torch_side._actions if a.option_strings != ["-h", "--help"]]
        family = next(f for f in launches._launch_structures().values() if f[1] is structures)[0]
        assert own == list(family.counter_options.launch_arguments)
    # the built-in methods the help lists are the registry's first ones
    assert method_names()[: len(counter_parsers.BUILTIN_METHODS)] == list(counter_parsers.BUILTIN_METHODS)


@pytest.mark.parametrize("family", ["infinity", "hart"])
def test_the_torch_free_convert_options_equal_the_librarys(family):
    """``var-accel convert <family> --help`` reads the lab's torch-free copy of the library's converter options."""
    import importlib

    from diffusers_var_accel.lab.families import lab_family

    def options(add_arguments):
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        return [(a.option_strings, a.required, a.choices, a.help, a.default) for a in parser._actions]

    library = importlib.import_module(f"diffusers_var_accel.pipelines.{family}.convert")
    assert options(lab_family(family).convert_command().add_arguments) == options(library.add_convert_arguments)


@pytest.mark.parametrize(
    "argv, typed, meant",
    [
        (["generate", "x", "--accell", "lazyvar"], "--accell", "--accel"),
        (["demo", "--repeat", "2"], "--repeat", "--repeats"),
    ],
)
def test_an_unknown_option_names_the_close_one_on_one_line(capsys, argv, typed, meant):
    from diffusers_var_accel.lab.cli import main

    assert main(argv) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and f"did you mean {meant} for {typed}?" in errors[0], errors


@pytest.mark.parametrize("command", ["demo", "bench", "serve"])
def test_accel_and_its_alias_methods_are_one_flag(command):
    from diffusers_var_accel.lab.cli import build_parser

    parser = build_parser([command])
    extra = ["-o", "x"] if command != "serve" else []
    assert parser.parse_args([command, "--accel", "lazyvar", *extra]).methods == "lazyvar"
    assert parser.parse_args([command, "--methods", "fastvar", *extra]).methods == "fastvar"
