from .convert import load_original_hart_pipeline
from .pipeline_hart import HARTPipeline, HARTScaleFamily

__all__ = ["HARTPipeline", "HARTScaleFamily", "load_original_hart_pipeline"]
