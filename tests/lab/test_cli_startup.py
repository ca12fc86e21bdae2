"""``var-accel --help`` and every command's ``--help`` answer without importing torch or diffusers (the parser is
built from light modules; each command imports what it runs); a mistyped option names the close one."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ["generate", "demo", "serve", "bench", "calibrate", "convert"]
HEAVY = ("torch", "diffusers", "transformers")


def test_every_help_imports_neither_torch_nor_diffusers():
    code = (
        "import contextlib, io, json, runpy, sys\n"
        f"heavy = {HEAVY!r}\n"
        "codes = []\n"
        "for argv in [['--help']] + [[c, '--help'] for c in " + repr(COMMANDS) + "]:\n"
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
    assert len(seen["codes"]) == 1 + len(COMMANDS)
    assert all(code == 0 and printed > 200 for code, printed in seen["codes"]), seen["codes"]


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
