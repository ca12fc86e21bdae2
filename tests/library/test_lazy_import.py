"""The package imports lazily (diffusers' style): ``import diffusers_var_accel`` costs no torch; the first public
name, or importing diffusers, loads the library as an eager import did (the pipelines registered with diffusers)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_package_imports_without_torch_and_loads_with_diffusers_or_on_first_use():
    seen = _run(
        "import json, sys\n"
        "import diffusers_var_accel as package\n"
        "before = sorted(m for m in ('torch', 'diffusers') if m in sys.modules)\n"
        "import diffusers\n"  # the library loads with it: a plain _class_name resolves in diffusers' namespace
        "registered = [getattr(diffusers, n, None).__module__ for n in ('InfinityPipeline', 'HARTPipeline')]\n"
        "from diffusers_var_accel import InfinityPipeline\n"
        "print(json.dumps({'before': before, 'registered': registered, 'same': diffusers.InfinityPipeline is InfinityPipeline,\n"
        "  'all': all(hasattr(package, n) for n in package.__all__), 'model_mixin': package.ModelMixin is diffusers.ModelMixin}))"
    )
    assert seen == {
        "before": [],
        "registered": [
            "diffusers_var_accel.pipelines.infinity.pipeline_infinity",
            "diffusers_var_accel.pipelines.hart.pipeline_hart",
        ],
        "same": True,
        "all": True,
        "model_mixin": True,
    }


def test_the_builtin_method_names_are_the_registry_s():
    from diffusers_var_accel.builtin_methods import BUILTIN_METHODS
    from diffusers_var_accel.schedulers.registry import METHODS, method_titles

    assert list(BUILTIN_METHODS) == list(METHODS)[: len(BUILTIN_METHODS)]
    assert list(BUILTIN_METHODS.values()) == method_titles()[: len(BUILTIN_METHODS)]
