"""The documentation site (``mkdocs.yml``, ``docs/``) builds with ``mkdocs build --strict``, and its API reference
pages hold signatures rendered from the package's docstrings by mkdocstrings.

``--strict`` turns every warning into an error: a broken link or anchor between pages, a page missing from the nav,
a nav entry without a page, or a docstring griffe cannot parse (a parameter that is not in the signature, a section
item without a type). Needs the ``docs`` extra (``pip install -e ".[docs]"``; the ``test`` extra includes it). No
network: mkdocstrings reads the sources statically and no inventories are configured.
"""

import importlib.util
import re
import subprocess
import sys
from html import unescape
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    for module in ("mkdocs", "mkdocstrings", "mkdocstrings_handlers"):
        if importlib.util.find_spec(module) is None:
            pytest.fail(
                f"{module} is not installed: pip install -e '.[docs]' (the test extra includes it)", pytrace=False
            )
    site_dir = tmp_path_factory.mktemp("site")
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--clean", "--site-dir", str(site_dir)]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        pytest.fail(
            f"`mkdocs {' '.join(cmd[3:])}` failed with exit status {proc.returncode} (every warning is an error "
            f"under --strict); mkdocs said:\n{proc.stdout}\n{proc.stderr}",
            pytrace=False,
        )
    return site_dir


def _page(site_dir: Path, page: str) -> str:
    path = site_dir / page / "index.html"
    assert path.is_file(), f"{page} was not built ({path} missing)"
    return path.read_text(encoding="utf-8")


def test_site_builds_strict_with_every_page(site):
    for page in (
        "",
        "quickstart",
        "fastvar",
        "lazyvar",
        "depthvar",
        "arvar",
        "acceleration",
        "infinity",
        "hart",
        "embedded",
        "next_scale_loop",
        "presets_and_hub",
        "cli",
        "benchmark_protocol",
        "benchmarks",
        "flops",
        "api",
    ):
        path = site / page / "index.html" if page else site / "index.html"
        assert path.is_file(), f"page {page or 'index'} missing from the built site"


@pytest.mark.parametrize(
    "page, expected",
    [
        (
            "api/pipelines",
            [
                "InfinityPipeline",
                "HARTPipeline",
                "enable_lazyvar",
                "enable_fastvar",
                "disable_acceleration",
                "guidance_scale",
                "prompt_embeds",
            ],
        ),
        (
            "api/schedulers",
            [
                "VARAccelScheduler",
                "ComposedScheduler",
                "IdentityScheduler",
                "keep_ratios",
                "group_scales",
                "prune_ratios",
                "reference_scale",
                "load_acceleration",
            ],
        ),
        ("api/presets", ["available_presets", "load_preset_config"]),
        (
            "api/models",
            [
                "InfinityTransformer",
                "InfinityBSQVAE",
                "HARTTransformer",
                "HARTHybridTokenizer",
                "VARAttnProcessor",
                "VARForwardContext",
            ],
        ),
        ("api/next_scale", ["run_next_scale_loop", "ScaleModelFamily", "NextScaleState"]),
        ("api/hub", ["write_model_card", "write_hub_shim", "read_benchmark_results"]),
        ("api/bench", ["run_bench", "load_prompt_set", "fid_star"]),
        ("api/data", ["render_scene", "heldout_prompts", "score_batch"]),
    ],
)
def test_api_pages_render_docstrings(site, page, expected):
    html = _page(site, page)
    assert 'class="doc doc-object' in html or "doc-heading" in html, f"{page}: no mkdocstrings output"
    missing = [name for name in expected if name not in html]
    assert not missing, f"{page}: the rendered API page lacks {missing}"


def _signatures(html: str) -> list:
    """The text of every rendered signature block (``separate_signature``), tags stripped."""
    blocks = re.findall(r'<div class="doc-signature[^"]*">(.*?)</div>', html, re.S)
    return [unescape(re.sub(r"<[^>]+>", "", block)) for block in blocks]


@pytest.mark.parametrize(
    "page, starts, contains",
    [
        # the class signature is its __init__'s (merge_init_into_class), with the parameters and their defaults
        (
            "api/schedulers",
            "LazyVARScheduler(",
            ["keep_ratios: Sequence[float] = (0.2, 0.1, 0.05, 0.01)", "group_scales"],
        ),
        ("api/schedulers", "FastVARScheduler(", ["prune_ratios", "skip_last_scales"]),
        ("api/schedulers", "DepthVARScheduler(", ["reference_scale"]),
        ("api/pipelines", "enable_lazyvar(", ["**overrides", "-> VARAccelScheduler"]),
        ("api/pipelines", "InfinityPipeline(", ["transformer: InfinityTransformer", "vae: InfinityBSQVAE"]),
        ("api/next_scale", "run_next_scale_loop(", ["family: ScaleModelFamily", "-> NextScaleState"]),
    ],
)
def test_signatures_are_rendered(site, page, starts, contains):
    signatures = [sig for sig in _signatures(_page(site, page)) if sig.lstrip().startswith(starts)]
    assert signatures, f"{page}: no rendered signature starting with {starts!r}"
    flat = " ".join(" ".join(signatures[0].split()).replace("( ", "(").replace(" )", ")").split())
    missing = [text for text in contains if " ".join(text.split()) not in flat]
    assert not missing, f"{page}: the signature of {starts[:-1]} lacks {missing}: {flat}"
