"""paradecode: parallel decoding for language models, lossless and measured.

    import paradecode
    model = paradecode.load("smollm2-135m")
    out = model.generate("Write a haiku about the sea", method="pld", max_new_tokens=128)
"""

from paradecode.api import GenerationResult, Model, load
from paradecode.backends.openmp import release_threads
from paradecode.config import GenerationConfig, SamplingConfig
from paradecode.errors import ParadecodeError
from paradecode.registry import method_names, register
from paradecode.stats import DecodeStats, StepRecord

__version__ = "0.1.0"

__all__ = [
    "load", "Model", "GenerationResult", "GenerationConfig", "SamplingConfig", "DecodeStats", "StepRecord",
    "ParadecodeError", "register", "method_names", "release_threads",
]
