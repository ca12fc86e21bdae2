"""``var-accel serve``: a web page that shows the baseline and acceleration methods side by side (Gradio).

Type a prompt, pick a seed and methods (the registered methods, with their settings editable as JSON, and any spec
``var-accel generate --accel`` takes: packaged presets, ``name:key=value`` overrides, compositions ``a+b``, scheduler
folders), and the page generates the baseline and every method with the same seed and shows the images side by side
with each one's time (median and spread of interleaved rounds after an untimed call), counted FLOPs, speed-up and
PSNR / SSIM against the baseline (:func:`~diffusers_var_accel.lab.comparison.compare_methods`), and under them each
one's ``pipe.acceleration_summary()``: tokens computed per pass, rows run, FLOPs against the baseline's, KV bytes. When the loaded model has
calibrations (the embedded model's ``embedded/<method>`` presets), their speed-fidelity frontier plots are shown.

Offline on the embedded model by default; ``--model`` takes what ``var-accel generate --model`` takes. One pipeline
serves every visitor: requests wait in Gradio's queue and the pipeline runs one call at a time (a lock), so
concurrent visitors never share a generator, a scheduler or an image. Bad input is shown as a message in the page,
never as a traceback. Gradio is an optional extra: ``pip install ".[app]"``.

Examples:
    ```
    var-accel serve                      # http://127.0.0.1:7860, the embedded model
    var-accel serve --model path/to/converted-infinity-2b --device cuda --dtype bfloat16
    ```

    ```py
    >>> from diffusers_var_accel.lab.serve import build_app
    >>> demo = build_app()        # the embedded model
    >>> demo.launch()
    ```
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

#: Methods ticked when the page opens.
DEFAULT_PICKED = ("lazyvar", "fastvar")

#: The most timed rounds a request may ask for (each round runs every method once).
MAX_REPEATS = 5

#: The most methods one request may run (besides the baseline).
MAX_METHODS = 8

#: What the page says when Gradio is missing.
GRADIO_MISSING = (
    'var-accel serve needs Gradio, an optional extra: pip install "diffusers-var-accel[app]" '
    '(from a source checkout: pip install -e ".[app]")'
)


def _import_gradio():
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # offline: no usage report at start
    try:
        import gradio as gr
    except ImportError as err:  # pragma: no cover - exercised without the extra
        raise ImportError(GRADIO_MISSING) from err
    return gr


class ComparisonService:
    """What the page does, without Gradio: the pipeline, its methods' presets and the requests (thread-safe).

    Args:
        pipe: the pipeline every request uses.
        sampling: its sampling arguments (the embedded model's evaluated ones for the embedded model).
    """

    def __init__(self, pipe: Any, sampling: Optional[Dict[str, Any]] = None):
        from diffusers_var_accel.schedulers.registry import method_names

        self.pipe = pipe
        self.sampling = dict(sampling or {})
        self.lock = threading.Lock()
        self.methods = method_names()
        pipe.set_progress_bar_config(disable=True)

    # -- methods and settings ----------------------------------------------------------------------------------------
    def preset(self, name: str):
        """The pipeline's preset scheduler of the method ``name`` (its own calibrated one when it has one)."""
        from diffusers_var_accel.schedulers.specs import load_acceleration

        return load_acceleration(name, self.pipe.model_family, preset_model=getattr(self.pipe, "preset_model", None))

    def settings_of(self, names: Sequence[str]) -> Dict[str, Dict[str, Any]]:
        """``{method: its preset's settings}`` (the constructor arguments a user may edit)."""
        out = {}
        for name in names:
            config = dict(self.preset(name).config)
            out[name] = {k: v for k, v in config.items() if not k.startswith("_") and k != "model_family"}
        return out

    def schedulers(self, picked: Sequence[str], settings_json: str, extra_specs: str) -> Dict[str, Any]:
        """The schedulers of one request: each picked method with the settings of ``settings_json`` (the page's
        editor, ``{method: {setting: value}}``), then every spec of ``extra_specs`` (comma-separated)."""
        from diffusers_var_accel.schedulers.presets import preset_constructor_kwargs
        from diffusers_var_accel.schedulers.specs import load_acceleration, split_acceleration_specs

        picked = list(picked or [])
        unknown = [m for m in picked if m not in self.methods]
        if unknown:
            raise ValueError(f"unknown methods {unknown}; known: {self.methods}")
        picked = [m for m in self.methods if m in picked]  # the checkboxes' order, whatever order they were ticked in
        try:
            edited = json.loads(settings_json) if settings_json and settings_json.strip() else {}
        except json.JSONDecodeError as err:
            raise ValueError(
                f"the settings are not valid JSON ({err.msg} at line {err.lineno}, column {err.colno}); "
                'they must be an object {"method": {"setting": value}}'
            ) from None
        if not isinstance(edited, dict) or not all(isinstance(v, dict) for v in edited.values()):
            raise ValueError('the settings must be a JSON object of objects: {"method": {"setting": value}}')
        stray = [m for m in edited if m not in picked]
        if stray:
            raise ValueError(
                f"the settings name methods that are not ticked: {stray}; tick them or remove their entries"
            )
        out: Dict[str, Any] = {}
        for name in picked:
            preset = self.preset(name)
            changes = edited.get(name, {})
            allowed = set(self.settings_of([name])[name])
            bad = sorted(set(changes) - allowed)
            if bad:
                raise ValueError(f"{name}: unknown settings {bad}; allowed: {sorted(allowed)}")
            stored = json.loads(json.dumps(dict(preset.config)))  # tuples as the editor's JSON lists
            if any(stored.get(k) != v for k, v in changes.items()):
                scheduler = type(preset)(**preset_constructor_kwargs({**stored, **changes}))
                label = f"{name} (edited)"
            else:
                scheduler, label = preset, name
            out[label] = scheduler
        for spec in split_acceleration_specs(extra_specs or ""):
            if spec in out:
                raise ValueError(f"{spec!r} is asked twice")
            out[spec] = load_acceleration(
                spec, self.pipe.model_family, preset_model=getattr(self.pipe, "preset_model", None)
            )
        if not out:
            raise ValueError("no method chosen: tick at least one method or type a spec under 'more methods'")
        if len(out) > MAX_METHODS:
            raise ValueError(f"{len(out)} methods in one request; at most {MAX_METHODS}")
        if "baseline" in out:
            raise ValueError("the baseline always runs first; do not ask for it among the methods")
        return out

    # -- one request -------------------------------------------------------------------------------------------------
    def run(
        self,
        prompt: str,
        seed: Any,
        size: str,
        picked: Sequence[str],
        settings_json: str,
        extra_specs: str,
        repeats: Any,
        progress=None,
    ):
        """One request: the :class:`~diffusers_var_accel.lab.comparison.Comparison` (every input checked first)."""
        from diffusers_var_accel.lab.comparison import compare_methods

        seed = _integer("seed", seed, 0, 2**63 - 1)
        repeats = _integer("repeats", repeats, 1, MAX_REPEATS)
        height, width = parse_size(size)
        schedulers = self.schedulers(picked, settings_json, extra_specs)
        return compare_methods(
            self.pipe,
            prompt,
            schedulers,
            seed=seed,
            repeats=repeats,
            sampling=self.sampling,
            height=height,
            width=width,
            progress=progress,
            lock=self.lock,
        )

    # -- calibrations --------------------------------------------------------------------------------------------------
    def frontier_plots(self, folder: Optional[Path] = None) -> List[Tuple[str, str]]:
        """``[(png path, caption)]``: the speed-fidelity frontier of every calibration of the loaded model's presets
        (``<preset model>/<method>/calibration.json``), drawn into ``folder`` (a temporary one by default)."""
        from diffusers_var_accel.lab.calibration import plot_frontier
        from diffusers_var_accel.schedulers.presets import preset_folder

        preset_model = getattr(self.pipe, "preset_model", None)
        plots = []
        folder = Path(folder or tempfile.mkdtemp(prefix="var-accel-serve-"))
        for name in self.methods:
            try:
                record_path = preset_folder(f"{preset_model}/{name}") / "calibration.json"
            except ValueError:  # no preset of this method for this model
                continue
            if not record_path.is_file():
                continue
            result = json.loads(record_path.read_text())
            if not result.get("tried"):
                continue
            path = plot_frontier(result, folder / f"frontier-{name}.png")
            chosen = result.get("chosen") or {}
            caption = f"{name}: {len(result['tried'])} settings"
            if chosen:
                caption += f"; chosen {chosen.get('flops_ratio', float('nan')):.2f}x FLOPs, SSIM {chosen.get('ssim_mean', float('nan')):.3f}"
            plots.append((str(path), caption))
        return plots


def _integer(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    return value


def parse_size(size: Optional[str]) -> Tuple[Optional[int], Optional[int]]:
    """``"HxW"`` (or ``"N"`` for a square) as ``(height, width)``; empty or ``"default"``: ``(None, None)``, the
    model's own size."""
    text = (size or "").strip().lower()
    if text in ("", "default"):
        return None, None
    parts = text.replace("×", "x").split("x")
    if len(parts) == 1:
        parts = parts * 2
    if len(parts) != 2 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise ValueError(
            f"size {size!r}: write it as HEIGHTxWIDTH (e.g. 1024x1024), one number for a square, or leave "
            "it empty for the model's own size"
        )
    return int(parts[0]), int(parts[1])


def build_app(
    pipe: Any = None,
    model: Optional[str] = None,
    device: str = "cpu",
    dtype: str = "float32",
    picked: Sequence[str] = DEFAULT_PICKED,
    repeats: int = 2,
):
    """The Gradio app (``gr.Blocks``, queued: one generation at a time). ``pipe``: a pipeline, or loaded from
    ``model`` (``None``: the embedded model) on ``device`` in ``dtype``."""
    gr = _import_gradio()
    from diffusers_var_accel.lab.comparison import TABLE_HEADERS, caption, summary_markdown, table_rows, to_pil
    from diffusers_var_accel.embedded import EMBEDDED_PRESET_MODEL, EMBEDDED_SAMPLING

    if pipe is None:
        from diffusers_var_accel.lab.loading import load_pipeline

        pipe = load_pipeline(model, device, dtype)
    # the embedded model is sampled as it is evaluated (docs/embedded.md); other models with their pipeline's defaults
    embedded = getattr(pipe, "preset_model", None) == EMBEDDED_PRESET_MODEL
    service = ComparisonService(pipe, sampling=EMBEDDED_SAMPLING if embedded else None)
    unknown = [m for m in picked if m not in service.methods]
    if unknown:
        raise ValueError(f"unknown methods to tick {unknown}; the registered methods are {service.methods}")
    _integer("repeats", repeats, 1, MAX_REPEATS)

    def on_pick(names):
        try:
            return json.dumps(service.settings_of(names or []), indent=2)
        except Exception as err:  # noqa: BLE001 - any failure is a message in the page
            raise gr.Error(_message(err))

    def on_generate(prompt, seed, size, names, settings_json, extra, rounds, progress=gr.Progress()):
        try:
            comparison = service.run(
                prompt,
                seed,
                size,
                names,
                settings_json,
                extra,
                rounds,
                progress=lambda fraction, message: progress(fraction, desc=message),
            )
        except Exception as err:  # noqa: BLE001 - never a traceback in the page
            raise gr.Error(_message(err))
        gallery = [(to_pil(r.image), caption(r)) for r in comparison.results]
        notes = "\n".join(f"- {n}" for n in comparison.notes())
        return gallery, table_rows(comparison), notes, summary_markdown(comparison)

    title = "diffusers-var-accel: the baseline and acceleration methods side by side"
    with gr.Blocks(title="diffusers-var-accel") as demo:
        shown = (
            "embedded (the packaged shapes model)"
            if embedded
            else (model or getattr(pipe, "name_or_path", None) or type(pipe).__name__)
        )
        gr.Markdown(
            f"# {title}\nModel: `{shown}` "
            f"({type(pipe).__name__}). Every method uses the same seed; time, FLOPs and fidelity are measured "
            "in the same request."
        )
        with gr.Row():
            prompt = gr.Textbox(label="prompt", value="two red circles", lines=2, scale=4, elem_id="prompt")
            with gr.Column(scale=1):
                seed = gr.Number(label="seed", value=0, precision=0, elem_id="seed")
                size = gr.Textbox(label="size (HxW; empty: the model's own)", value="", elem_id="size")
        with gr.Row():
            methods = gr.CheckboxGroup(choices=service.methods, value=list(picked), label="methods", elem_id="methods")
            rounds = gr.Slider(1, MAX_REPEATS, value=repeats, step=1, label="timed rounds", elem_id="repeats")
        with gr.Accordion("settings of the ticked methods (editable JSON)", open=False):
            settings = gr.Code(
                value=json.dumps(service.settings_of(picked), indent=2),
                language="json",
                label="settings",
                elem_id="settings",
                interactive=True,
            )
        extra = gr.Textbox(
            label="more methods (comma-separated specs: infinity-2b/lazyvar, "
            "lazyvar:keep_ratios=[0.5,0.2], lazyvar+arvar, a scheduler folder)",
            value="",
            elem_id="extra",
        )
        button = gr.Button("Generate", variant="primary", elem_id="generate")
        gallery = gr.Gallery(
            label="images (baseline first)",
            columns=4,
            height="auto",  # a fixed height hid each image's lower part and its caption behind a scroll bar
            object_fit="contain",  # each image whole at its own aspect (a size other than square is not cropped)
            elem_id="images",
            format="png",
        )
        # beside the images: what each method's passes computed (pipe.acceleration_summary() of its call)
        summaries = gr.Markdown(label="what each method computed", elem_id="summaries")
        table = gr.Dataframe(headers=TABLE_HEADERS, label="numbers", interactive=False, elem_id="table")
        notes = gr.Markdown(elem_id="notes")
        plots = service.frontier_plots()
        if plots:
            with gr.Accordion("speed-fidelity frontier of this model's calibrations", open=False):
                gr.Gallery(
                    value=plots, columns=2, height="auto", object_fit="contain", label="frontier", elem_id="frontier"
                )  # contain: the default cover centre-cropped the plots (their left panel and x label)
        methods.change(on_pick, inputs=methods, outputs=settings)
        button.click(
            on_generate,
            inputs=[prompt, seed, size, methods, settings, extra, rounds],
            outputs=[gallery, table, notes, summaries],  # summaries last: the API's first three stay
            concurrency_limit=1,
            api_name="generate",
        )
    demo.queue(default_concurrency_limit=1)
    return demo


def _message(err: BaseException) -> str:
    """One line for the page: the error's own message (ours name the bad value and what is allowed)."""
    text = " ".join(str(err).split()) or type(err).__name__
    return (
        text
        if isinstance(err, (ValueError, KeyError, FileNotFoundError, ImportError))
        else f"{type(err).__name__}: {text}"
    )


# Gradio draws a gallery caption on one line cut short with an ellipsis at 80% of the image's width, which hid the
# numbers (time, FLOPs, SSIM); here it wraps, spans the image's width and stays readable. And a gallery of
# height="auto" still stops at 55% of the window and scrolls inside (the frontier's third row of plots was hidden);
# here it grows with its rows and the page scrolls instead.
GALLERY_CSS = """
#images .grid-wrap, #frontier .grid-wrap { max-height: none; }
#images .caption-label, #frontier .caption-label {
  white-space: normal; text-overflow: clip; max-width: none; left: var(--block-label-margin); opacity: 0.9;
}
"""


def launch_options(host: str = "127.0.0.1", port: int = 7860) -> Dict[str, Any]:
    """The arguments of ``demo.launch`` for this page: the address, no server-side rendering (no Node.js needed) and a
    theme with system fonts only (no web fonts: the page works offline)."""
    gr = _import_gradio()
    theme = gr.themes.Default(
        font=["ui-sans-serif", "system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"]
    )
    # quiet: no "set share=True in launch()" hint, which a command-line user cannot act on (serve prints the address)
    return dict(
        server_name=host,
        server_port=port,
        ssr_mode=False,
        theme=theme,
        css=GALLERY_CSS,
        footer_links=["api"],
        quiet=True,
    )


def serve(
    model: Optional[str] = None,
    device: str = "cpu",
    dtype: str = "float32",
    host: str = "127.0.0.1",
    port: int = 7860,
    picked: Sequence[str] = DEFAULT_PICKED,
    repeats: int = 2,
) -> None:
    """Build the app and serve it until interrupted."""
    demo = build_app(model=model, device=device, dtype=dtype, picked=picked, repeats=repeats)
    print(f"serving on http://{host}:{port} (Ctrl-C stops it)", flush=True)
    demo.launch(**launch_options(host, port))
