"""Samplers for masked diffusion decoding, one per file, registered by name on import."""

from paradecode.dllm.samplers import entropy, factor, margin, oracle, pool, random, threshold, topk  # noqa: F401
from paradecode.dllm.samplers.base import Sampler, StepView, build_sampler, sampler_names

__all__ = ["Sampler", "StepView", "build_sampler", "sampler_names"]
