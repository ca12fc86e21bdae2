"""Install script for diffusers-var-accel.

Install torch first on CPU-only machines (``pip install torch==2.13.0``), otherwise pip may pull a large CUDA build.
"""

import re
from pathlib import Path

from setuptools import find_packages, setup

# The version lives in one leaf module; read as text, since importing the package needs its dependencies installed.
VERSION = re.search(
    r'^__version__ = "([^"]+)"$',
    (Path(__file__).parent / "diffusers_var_accel" / "version.py").read_text(encoding="utf-8"),
    re.M,
).group(1)

# The documentation site (mkdocs.yml, docs/): `mkdocs build --strict`; tests/test_docs_site.py builds it, so the test
# extra includes it.
docs_requires = ["mkdocs>=1.6", "mkdocstrings[python]>=0.26", "pymdown-extensions>=10"]

# The web page (var-accel serve, app.py). Its tests drive it in a headless Chromium through Selenium (the browser is
# Debian's chromium + chromium-driver, which .ci/run installs; without them the browser test is skipped, saying so).
app_requires = ["gradio>=5,<7"]

# The lab's plots (var-accel bench's figures, calibration frontiers); the library and var-accel demo run without it.
lab_requires = ["matplotlib"]

extras = {
    # ipywidgets: tqdm's notebook progress bars (without it every notebook run warns "IProgress not found")
    "test": [
        "pytest>=8",
        # the README's test command runs two workers (one per core) and stops a hung test instead of the whole run
        "pytest-xdist>=3",
        "pytest-timeout>=2",
        "tokenizers>=0.20",
        "sentencepiece>=0.2",
        "nbclient>=0.10",
        "nbformat>=5.10",
        "ipykernel>=6",
        "ipywidgets>=8",
        *docs_requires,
        *app_requires,
        *lab_requires,
        "selenium>=4.20",
        # LoRA on the transformers (diffusers' PEFT backend): tests/library/test_lora.py
        "peft>=0.17",
        # torchao weight quantisation (int8 / float8 weight-only): tests/library/test_quantization.py; it requires
        # no package (torch is already there), and its version pairs with torch's
        "torchao>=0.18,<0.19",
        # the lint and format check of tests/test_style.py (pinned: another version may format differently)
        "ruff==0.17.6",
    ],
    "lab": lab_requires,
    "app": [*app_requires, *lab_requires],
    "docs": docs_requires,
    "flash": ["flash-attn>=2.6"],
    "eval": ["torchmetrics>=1.6", "scipy>=1.11"],
}

setup(
    name="diffusers-var-accel",
    version=VERSION,
    description="Infinity and HART visual autoregressive models in the style of Diffusers, with training-free acceleration.",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    packages=find_packages(include=["diffusers_var_accel", "diffusers_var_accel.*"]),
    package_data={
        "diffusers_var_accel": [
            "py.typed",
            "embedded/*/*.json",
            "embedded/*/*/*.json",
            "embedded/*/*/*.safetensors",
            "embedded/*/*/*.txt",
            "presets/*/*/*.json",
            "lab/data/geneval/*.jsonl",
            "lab/data/geneval/LICENSE",
            "lab/data/geneval/README.md",
        ]
    },
    python_requires=">=3.10",
    install_requires=[
        "torch>=2.4",
        "diffusers>=0.42,<0.43",
        "transformers>=5",
        "safetensors>=0.4",
        "huggingface_hub>=0.34",
        "accelerate>=1.0",
        "numpy",
        "pillow",
        "tqdm",
    ],
    extras_require=extras,
    entry_points={"console_scripts": ["var-accel=diffusers_var_accel.lab.cli:main"]},
)
