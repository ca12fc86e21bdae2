"""The web page of diffusers-var-accel, as a Hugging Face Space runs it (``python app.py``): the embedded model, the
baseline and the chosen acceleration methods side by side. The same page as ``var-accel serve``
(:mod:`diffusers_var_accel.lab.serve`); needs ``pip install ".[app]"``."""

import os

from diffusers_var_accel.lab.serve import build_app, launch_options

demo = build_app(model=os.environ.get("VAR_ACCEL_MODEL"))

if __name__ == "__main__":
    demo.launch(
        **launch_options(
            host=os.environ.get("GRADIO_SERVER_NAME", "0.0.0.0"),
            port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
        )
    )
