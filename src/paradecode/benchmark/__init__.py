"""The benchmark: every requested method on Spec-Bench-format questions, one process, the same weights.

``paradecode bench`` runs paradecode's registered methods and peer implementations (transformers
``generate()``, llama.cpp) question by question, writes every raw figure to ``results.json``, and summarises
them in ``report.md``, plots and Spec-Bench answer files. Pieces:

- ``questions``: read and select Spec-Bench-format questions;
- ``peers``: the peer registry (``hf``, ``hf-pld``, ``hf-draft``, ``llamacpp``);
- ``runner``: warm-up, interleaved runs, the append-only record log, resume;
- ``metrics``: pure functions from records to figures;
- ``report`` / ``answers``: ``report.md``, plots, ``model_answer/<method>.jsonl``;
- ``commands``: the ``bench`` and ``trace`` CLI commands.
"""
