"""Masked diffusion language models: a sibling of the autoregressive engine, never a drafter.

    from paradecode.dllm import load, generate
    model = load("waiting-line")
    result = generate(model, "reverse : 7 3 9 1 4", sampler="threshold", threshold=0.9)
    result.text, result.stats.forward_passes, result.stats.mean_accepted  # same DecodeStats as the AR methods

Pieces: ``protocol`` (what a diffusion model provides, loading), ``model`` (our small transformer), ``decode``
(the loop), ``samplers/`` (one per file), ``cache``, ``tasks`` (synthetic suites), ``train``, ``bench``,
``report``, ``hf`` (Hugging Face diffusion models), ``ar`` (the AR twin), ``ar_backend`` (the twin as a chain-only
backend, for paradecode's lossless methods), ``trace``, ``commands`` (the CLI).
"""

from __future__ import annotations

from paradecode.dllm.decode import DecodeConfig, DiffusionResult, diffuse
from paradecode.dllm.protocol import load_diffusion_model as load
from paradecode.dllm.samplers import build_sampler, sampler_names


def generate(model, prompt: str, *, sampler: str = "topk", config: DecodeConfig | None = None,
             **options) -> DiffusionResult:
    """Decode ``prompt`` with the sampler ``sampler`` (``options``: its options, e.g. threshold=0.9)."""
    return diffuse(model, model.encode(prompt), build_sampler(sampler, options), config or DecodeConfig())


__all__ = ["load", "generate", "diffuse", "DecodeConfig", "DiffusionResult", "build_sampler", "sampler_names"]
