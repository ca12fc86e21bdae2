"""``var-accel serve``: the comparison behind the page, its checks of the input, concurrent visitors, and the page
itself in a real (headless) Chromium."""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from diffusers_var_accel.lab.comparison import Comparison, MethodResult, compare_methods, to_pil
from diffusers_var_accel.embedded import EMBEDDED_SAMPLING
from diffusers_var_accel.pipelines.pipeline_loading import load_embedded_pipeline
from diffusers_var_accel.lab.serve import ComparisonService, parse_size

PROMPT = "a red circle above a blue square"


@pytest.fixture(scope="module")
def pipe():
    pipe = load_embedded_pipeline()
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def service(pipe):
    return ComparisonService(pipe, EMBEDDED_SAMPLING)


def _direct(pipe, prompt, seed, scheduler=None):
    return pipe(
        prompt,
        generator=torch.Generator().manual_seed(seed),
        output_type="pt",
        acceleration=scheduler,
        **EMBEDDED_SAMPLING,
    ).images


def test_the_comparison_is_the_pipeline_calls_it_stands_for(pipe, service):
    comparison = service.run(PROMPT, 3, "", ["lazyvar", "arvar"], "", "", 2)
    assert [r.spec for r in comparison.results] == ["baseline", "lazyvar", "arvar"]
    by_spec = {r.spec: r for r in comparison.results}
    assert torch.equal(by_spec["baseline"].image, _direct(pipe, PROMPT, 3))
    assert torch.equal(by_spec["lazyvar"].image, _direct(pipe, PROMPT, 3, service.preset("lazyvar")))
    assert all(len(r.seconds) == 2 and r.flops > 0 for r in comparison.results)
    base = by_spec["baseline"]
    assert base.psnr == float("inf") and base.ssim == pytest.approx(1.0) and base.flops_ratio == 1.0
    assert by_spec["lazyvar"].flops < base.flops  # counted, not assumed: the preset removes FLOPs
    assert by_spec["lazyvar"].flops_ratio == pytest.approx(base.flops / by_spec["lazyvar"].flops)
    per_round = sorted(b / m for b, m in zip(base.seconds, by_spec["lazyvar"].seconds))  # baseline and method in pairs
    assert by_spec["lazyvar"].speedup == pytest.approx(sum(per_round) / 2)
    # each result carries the summary of its own call: the same as a direct call's, fewer token-layers for lazyvar
    _direct(pipe, PROMPT, 3, service.preset("lazyvar"))
    assert by_spec["lazyvar"].summary == pipe.acceleration_summary()
    assert base.summary["token_layers"] == base.summary["baseline_token_layers"]
    assert by_spec["lazyvar"].summary["token_layers"] < base.summary["token_layers"]


def test_edited_settings_build_the_edited_scheduler(pipe, service):
    settings = service.settings_of(["lazyvar"])
    unchanged = service.schedulers(["lazyvar"], json.dumps(settings), "")
    assert list(unchanged) == ["lazyvar"]  # the same values: the preset itself
    n = len(settings["lazyvar"]["group_scales"])  # the preset's group: one keep ratio per scale
    settings["lazyvar"]["keep_ratios"] = [0.5] * n
    spec = "lazyvar:keep_ratios=[" + ",".join(["0.3"] * n) + "]"
    edited = service.schedulers(["lazyvar"], json.dumps(settings), spec)
    assert list(edited) == ["lazyvar (edited)", spec]
    assert tuple(edited["lazyvar (edited)"].config.keep_ratios) == (0.5,) * n
    assert tuple(edited[spec].config.keep_ratios) == (0.3,) * n


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(seed="abc"), "seed must be an integer"),
        (dict(seed=-1), "seed must be an integer in [0,"),
        (dict(size="12y"), "size '12y': write it as HEIGHTxWIDTH"),
        (dict(picked=[]), "no method chosen"),
        (dict(picked=["nope"]), "unknown methods ['nope']"),
        (dict(settings="{bad"), "the settings are not valid JSON"),
        (dict(settings='{"fastvar": {}}'), "the settings name methods that are not ticked: ['fastvar']"),
        (dict(settings='{"lazyvar": {"speed": 3}}'), "lazyvar: unknown settings ['speed']; allowed:"),
        (dict(extra="nope"), "unknown acceleration 'nope'"),
        (dict(extra="baseline"), "the baseline always runs first"),
        (dict(prompt="  "), "the prompt is empty"),
        (dict(repeats=9), "repeats must be an integer in [1, 5]"),
    ],
)
def test_bad_input_gets_a_message_naming_it(service, arguments, message):
    args = dict(prompt=PROMPT, seed=0, size="", picked=["lazyvar"], settings="", extra="", repeats=1)
    args.update(arguments)
    with pytest.raises(ValueError) as err:
        service.run(
            args["prompt"],
            args["seed"],
            args["size"],
            args["picked"],
            args["settings"],
            args["extra"],
            args["repeats"],
        )
    assert message in str(err.value)


def test_sizes_parse_or_say_how_to_write_them():
    assert parse_size("") == (None, None) and parse_size("default") == (None, None)
    assert parse_size("1024x768") == (1024, 768) and parse_size("512") == (512, 512)
    with pytest.raises(ValueError, match="HEIGHTxWIDTH"):
        parse_size("0x3")


def test_notes_flag_a_wide_spread():
    steady = MethodResult("lazyvar", torch.zeros(1, 3, 2, 2), [1.0, 1.1], 10)
    noisy = MethodResult("fastvar", torch.zeros(1, 3, 2, 2), [1.0, 1.0, 2.0], 10)  # median 1, spread 1
    notes = Comparison(PROMPT, 0, 2, [steady, noisy]).notes()
    assert not any("lazyvar" in n for n in notes)
    assert any(n.startswith("fastvar: its times spread by 100%") for n in notes)


def test_the_lock_serialises_the_pipeline_calls(pipe):
    """Two comparisons from two threads through one lock never run pipeline calls at the same time."""
    lock, active, overlap = threading.Lock(), [0], [False]
    original = type(pipe).__call__

    def watched(self, *args, **kwargs):
        active[0] += 1
        overlap[0] |= active[0] > 1
        try:
            time.sleep(0.01)
            return original(self, *args, **kwargs)
        finally:
            active[0] -= 1

    type(pipe).__call__ = watched
    try:
        with ThreadPoolExecutor(2) as pool:
            jobs = [
                pool.submit(
                    compare_methods, pipe, PROMPT, {}, seed=s, repeats=1, sampling=EMBEDDED_SAMPLING, lock=lock
                )
                for s in (0, 1)
            ]
            [job.result() for job in jobs]
    finally:
        type(pipe).__call__ = original
    assert not overlap[0]


# ---------------------------------------------------------------------------------------------------------------------
# the running app
# ---------------------------------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def app_url(pipe):
    pytest.importorskip("gradio", reason="the app needs the [app] extra (gradio)")
    from diffusers_var_accel.lab.serve import build_app, launch_options

    demo = build_app(pipe=pipe, repeats=1)
    port = _free_port()
    demo.launch(prevent_thread_lock=True, **launch_options("127.0.0.1", port))
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        demo.close()


def _png(path) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(path).convert("RGB"))


def test_twenty_concurrent_visitors_each_get_their_own_images(pipe, app_url):
    """20 requests at once on 127.0.0.1, each with its own seed and method: each gets the images of its own seed and
    method (as the pipeline makes them alone), with its own rows."""
    from gradio_client import Client

    client = Client(app_url, verbose=False)
    methods = ["lazyvar", "fastvar", "arvar", "depthvar"]
    requests = [(seed, methods[seed % len(methods)]) for seed in range(20)]
    jobs = [client.submit(PROMPT, seed, "", [method], "", "", 1, api_name="/generate") for seed, method in requests]
    for (seed, method), job in zip(requests, jobs):
        gallery, table, notes, summaries = job.result(timeout=600)
        assert [row[0] for row in table["data"]] == ["baseline", method]
        assert f"**{method}**: what its passes computed" in summaries and "token-layers computed" in summaries
        images = [
            _png(item["image"]["path"] if isinstance(item["image"], dict) else item["image"]) for item in gallery
        ]
        expected = [
            np.asarray(to_pil(_direct(pipe, PROMPT, seed))),
            np.asarray(to_pil(_direct(pipe, PROMPT, seed, ComparisonService(pipe).preset(method)))),
        ]
        assert len(images) == 2
        for got, want in zip(images, expected):
            assert np.array_equal(got, want), (seed, method)


# For each image under the selector: its natural size, the part of it drawn (after object-fit), the part of that left
# visible by every clipping ancestor (overflow other than visible, up to the gallery) and by the window; and the same
# for each caption. An image is whole when what is drawn is the whole image at its own aspect and all of it is visible.
_RENDERED_JS = """
const root = document.querySelector(arguments[0]);
function clip(el, r) {
  let out = {left: r.left, top: r.top, right: r.right, bottom: r.bottom};
  for (let a = el.parentElement; a; a = a.parentElement) {
    const s = getComputedStyle(a);
    if (s.overflowX !== 'visible' || s.overflowY !== 'visible') {
      const b = a.getBoundingClientRect();
      out = {left: Math.max(out.left, b.left), top: Math.max(out.top, b.top),
             right: Math.min(out.right, b.right), bottom: Math.min(out.bottom, b.bottom)};
    }
    if (a === root) break;
  }
  return out;
}
function drawn(img) {
  const r = img.getBoundingClientRect(), fit = getComputedStyle(img).objectFit;
  const nw = img.naturalWidth, nh = img.naturalHeight;
  let w = r.width, h = r.height, cropped = false, stretched = false;
  if (fit === 'contain' || (fit === 'scale-down' && (nw > r.width || nh > r.height))) {
    const k = Math.min(r.width / nw, r.height / nh); w = nw * k; h = nh * k;
  } else if (fit === 'none' || fit === 'scale-down') {
    w = Math.min(nw, r.width); h = Math.min(nh, r.height); cropped = nw > r.width + 0.5 || nh > r.height + 0.5;
  } else if (fit === 'cover') {
    cropped = Math.abs(r.width / r.height - nw / nh) > 0.01 * (nw / nh);
  } else {  // fill: the box's own aspect
    stretched = Math.abs(r.width / r.height - nw / nh) > 0.01 * (nw / nh);
  }
  const left = r.left + (r.width - w) / 2, top = r.top + (r.height - h) / 2;
  return {fit, nw, nh, cropped, stretched, box: {left, top, right: left + w, bottom: top + h}};
}
const images = Array.from(root.querySelectorAll('img')).map(img => {
  const d = drawn(img); d.visible = clip(img, d.box); return d;
});
const captions = Array.from(root.querySelectorAll(arguments[1])).map(c => {
  const r = c.getBoundingClientRect();
  return {text: c.innerText, truncated: c.scrollWidth > c.clientWidth + 1 || c.scrollHeight > c.clientHeight + 1,
          box: {left: r.left, top: r.top, right: r.right, bottom: r.bottom}, visible: clip(c, r)};
});
return {images, captions, window: {width: window.innerWidth, height: window.innerHeight}};
"""


def _hidden_parts(rendered) -> list:
    """What of each image (or caption) is cropped, stretched or hidden; empty when everything is whole and visible."""
    problems = []
    for i, image in enumerate(rendered["images"]):
        box, seen = image["box"], image["visible"]
        if image["cropped"] or image["stretched"]:
            problems.append(f"image {i}: object-fit {image['fit']} crops or stretches it ({image})")
        if any(abs(box[k] - seen[k]) > 1 for k in ("left", "top", "right", "bottom")):
            problems.append(f"image {i}: only {seen} of {box} is visible")
    for caption in rendered["captions"]:
        box, seen = caption["box"], caption["visible"]
        if caption["truncated"]:
            problems.append(f"caption {caption['text']!r}: cut short (ellipsis)")
        if box["right"] - box["left"] < 1 or any(
            abs(box[k] - seen[k]) > 1 for k in ("left", "top", "right", "bottom")
        ):
            problems.append(f"caption {caption['text']!r}: only {seen} of {box} is visible")
    return problems


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def test_the_page_in_a_real_browser(app_url, tmp_path):
    """Headless Chromium: type a prompt, pick two methods, generate; the three images appear with their numbers."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="the browser test needs selenium (the [test] extra)")
    browser, driver_path = _chromium(), shutil.which("chromedriver")
    if browser is None or driver_path is None:
        pytest.skip(
            "no Chromium and ChromeDriver on this machine (Debian: apt-get install chromium chromium-driver; "
            ".ci/run installs them)"
        )
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1400,1800",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=driver_path), options=options)
    try:
        driver.get(app_url)
        wait = WebDriverWait(driver, 120)
        box = wait.until(EC.element_to_be_clickable((By.CSS_SELECTOR, "#prompt textarea")))
        box.clear()
        box.send_keys("two green triangles")
        for label in driver.find_elements(By.CSS_SELECTOR, "#methods label"):
            ticked = label.find_element(By.CSS_SELECTOR, "input").is_selected()
            if (label.text.strip() in ("lazyvar", "arvar")) != ticked:
                label.click()  # leaves exactly lazyvar and arvar ticked
        driver.find_element(By.CSS_SELECTOR, "#generate").click()
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#images img")) >= 3)
        wait.until(lambda d: "arvar" in d.find_element(By.CSS_SELECTOR, "#table").text)
        table = driver.find_element(By.CSS_SELECTOR, "#table").text
        for expected in ("baseline", "lazyvar", "arvar", "1.00x", "inf"):
            assert expected in table
        assert "fastvar" not in table
        captions = driver.find_element(By.CSS_SELECTOR, "#images").text
        assert "SSIM" in captions and "FLOPs" in captions
        wait.until(
            lambda d: d.execute_script(
                "return Array.from(document.querySelectorAll('#images img'))"
                ".every(i => i.complete && i.naturalWidth > 0)"
            )
        )
        rendered = driver.execute_script(_RENDERED_JS, "#images", ".caption-label")
        assert len(rendered["images"]) == 3 and len(rendered["captions"]) == 3, rendered
        problems = _hidden_parts(rendered)
        assert not problems, "\n".join(problems)
        opener = [b for b in driver.find_elements(By.CSS_SELECTOR, "button") if "frontier" in b.text]
        if opener:  # the loaded model has calibrations: their plots, whole
            opener[0].click()
            wait.until(
                lambda d: d.execute_script(
                    "const i = document.querySelectorAll('#frontier img');"
                    "return i.length > 0 && Array.from(i).every(x => x.complete && x.naturalWidth > 0)"
                )
            )
            plots = driver.execute_script(_RENDERED_JS, "#frontier", ".caption-label")
            problems = _hidden_parts(plots)
            assert not problems, "\n".join(problems)
        assert "median of 1 timed round" in driver.find_element(By.CSS_SELECTOR, "#notes").text
        summaries = driver.find_element(By.CSS_SELECTOR, "#summaries").text  # each method's acceleration_summary()
        for expected in (
            "lazyvar: what its passes computed",
            "arvar: what its passes computed",
            "token-layers computed",
        ):
            assert expected in summaries, summaries
        lazyvar = summaries[summaries.index("lazyvar:") : summaries.index("arvar:")]
        assert "FLOPs (counted)" in lazyvar and "KV cache" in lazyvar and "100.0%" not in lazyvar, lazyvar
        driver.save_screenshot(str(tmp_path / "serve.png"))
        assert (tmp_path / "serve.png").stat().st_size > 10_000
    finally:
        driver.quit()


def test_the_service_runs_a_hart_pipeline_with_its_own_presets():
    from diffusers_var_accel.pipelines.hart.tiny import build_tiny_hart_pipeline

    hart = build_tiny_hart_pipeline(seed=0)
    service = ComparisonService(hart)
    comparison = service.run("a red fox", 5, "", ["lazyvar"], "", "", 1)
    assert [r.spec for r in comparison.results] == ["baseline", "lazyvar"]
    lazyvar = service.preset("lazyvar")
    assert lazyvar.config.model_family == hart.model_family
    expected = hart(
        "a red fox", generator=torch.Generator().manual_seed(5), output_type="pt", acceleration=lazyvar
    ).images
    assert torch.equal(comparison.results[1].image, expected)


def test_build_app_refuses_an_unknown_method_to_tick(pipe):
    pytest.importorskip("gradio", reason="the app needs the [app] extra (gradio)")
    from diffusers_var_accel.lab.serve import build_app

    with pytest.raises(ValueError, match=r"unknown methods to tick \['nope'\]"):
        build_app(pipe=pipe, picked=("lazyvar", "nope"))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["serve", "--methods", "lazyvar,nope"], "--methods lazyvar,nope: unknown methods ['nope']"),
        (["serve", "--repeats", "0"], "--repeats 0: must be in [1, 5]"),
        (["serve", "--device", "nope"], "--device nope: not a torch device"),
    ],
)
def test_serve_command_checks_its_arguments_before_loading(argv, message, capsys):
    from diffusers_var_accel.lab.cli import main

    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_serve_command_without_gradio_says_how_to_install_it(monkeypatch, capsys):
    import importlib.util

    from diffusers_var_accel.lab.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gradio" else real(name, *a))
    assert main(["serve"]) == 2
    assert 'pip install "diffusers-var-accel[app]"' in capsys.readouterr().err


def test_results_come_in_the_checkboxes_order_whatever_the_ticking_order(service):
    ticked = ["stagevar", "fastvar", "arvar"]  # as clicked
    assert list(service.schedulers(ticked, "", "")) == [m for m in service.methods if m in ticked]


def test_the_launch_prints_no_share_hint():
    pytest.importorskip("gradio", reason="the app needs the [app] extra (gradio)")
    from diffusers_var_accel.lab.serve import launch_options

    assert launch_options()["quiet"] is True and "share" not in launch_options()
