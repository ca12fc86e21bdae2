"""notebooks/quickstart.ipynb runs headless, offline, in a temporary folder, with this interpreter's kernel."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from registry_lists import SPECS

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

REPO_ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO_ROOT / "notebooks" / "quickstart.ipynb"
METHODS = SPECS  # the baseline and every library method: what the notebook runs (default_method_specs())

# Appended to the notebook's "parameters" cell (as papermill would): fewer benchmark prompts to keep the test short.
TEST_PARAMETERS = "\nNUM_BENCH_PROMPTS = 3\nBENCH_REPEATS = 1\n"

# Appended as a last cell: which interpreter and which copy of the package the kernel used.
PROBE = (
    "import json, sys, diffusers_var_accel\n"
    "print('PROBE ' + json.dumps({'prefix': sys.prefix, 'package': diffusers_var_accel.__file__}))"
)


def _stream_text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")


def _has_png(cell) -> bool:
    return any(
        "image/png" in o.get("data", {})
        for o in cell.get("outputs", [])
        if o.get("output_type") in ("display_data", "execute_result")
    )


def test_notebook_is_stored_clean():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code), (
        "store the notebook without outputs"
    )
    assert NOTEBOOK.stat().st_size < 64 * 1024
    assert sum("parameters" in c.metadata.get("tags", []) for c in code) == 1


def test_quickstart_notebook_executes(tmp_path, monkeypatch):
    from ipykernel.kernelspec import install
    from jupyter_client import KernelManager
    from jupyter_client.kernelspec import KernelSpecManager

    # A "python3" kernelspec for this interpreter, so the kernel imports the package of this checkout (whatever a
    # user-level "python3" kernelspec would point to).
    spec_dir = install(prefix=str(tmp_path / "kernel"), kernel_name="python3")
    ksm = KernelSpecManager(kernel_dirs=[str(Path(spec_dir).parent)])
    km = KernelManager(kernel_name="python3", kernel_spec_manager=ksm)
    assert km.kernel_spec.argv[0] == sys.executable

    # The kernel inherits this environment: offline, headless matplotlib, the repository first on the path.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    work = tmp_path / "work"
    work.mkdir()

    nb = nbformat.read(NOTEBOOK, as_version=4)
    params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])][0]
    params.source += TEST_PARAMETERS
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))

    client = nbclient.NotebookClient(
        nb, km=km, kernel_name="python3", timeout=300, allow_errors=False, resources={"metadata": {"path": str(work)}}
    )
    client.execute()  # raises CellExecutionError on the first failing cell

    code = [c for c in nb.cells if c.cell_type == "code"]
    assert not [o for c in code for o in c.outputs if o.get("output_type") == "error"]
    text = "\n".join(_stream_text(c) for c in code)
    stderr = "".join(o.get("text", "") for c in code for o in c.outputs if o.get("name") == "stderr")
    assert "IProgress not found" not in stderr and "TqdmWarning" not in stderr  # ipywidgets is in the [test] extra

    # The kernel ran this interpreter and the package of this checkout.
    probe = json.loads(text.split("PROBE ", 1)[1].splitlines()[0])
    assert os.path.realpath(probe["prefix"]) == os.path.realpath(sys.prefix)
    assert Path(probe["package"]).resolve().is_relative_to(REPO_ROOT)

    # Section 3: disabling restores the baseline; a PSNR table with every method.
    assert "after disable_acceleration(): identical to the first baseline image" in text
    table = text.split("PSNR vs baseline (same prompt and seed, one call each)", 1)[1]
    rows = {line.split()[0]: line.split() for line in table.splitlines()[2 : 2 + len(METHODS)]}
    assert set(rows) == set(METHODS)
    assert rows["baseline"][1] == "inf"
    for m in METHODS[1:]:
        assert 5.0 < float(rows[m][1]) < 80.0, rows[m]

    # Section 4: the packaged preset by name, per call, gives the enable_lazyvar() image and attaches nothing.
    assert "same image as enable_lazyvar(): True" in text
    assert "scheduler attached to the pipeline afterwards: None" in text

    # Section 5: the benchmark table and its files.
    bench_table = text.split("speed-up vs fidelity (3 prompts", 1)[1]
    assert all(f"\n{m} " in bench_table for m in METHODS)
    out = work / "quickstart_outputs"
    results = json.loads((out / "bench" / "results.json").read_text())
    assert set(results["methods"]) == set(METHODS)
    assert results["run"]["num_prompts"] == 3 and results["run"]["model"] == "embedded"
    assert results["methods"]["lazyvar"]["flops"]["ratio"] > 1.5
    for name in (
        "methods_side_by_side.png",
        "speedup_vs_psnr.png",
        "bench/speedup_vs_fidelity.png",
        "bench/scale_breakdown.png",
    ):
        assert (out / name).stat().st_size > 5000, name

    # Figures are displayed in the notebook: the side-by-side panels and the speed-up/fidelity plot at least.
    assert sum(_has_png(c) for c in code) >= 3

    # Nothing was written into the repository.
    assert not (REPO_ROOT / "notebooks" / "quickstart_outputs").exists()
    assert not (REPO_ROOT / "quickstart_outputs").exists()
