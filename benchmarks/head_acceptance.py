"""Teacher-forced acceptance of draft heads on Spec-Bench's own answers (docs/heads.md, "Held-out is not
Spec-Bench").

The int8 model answers the first ``--per-category`` questions of every Spec-Bench category greedily (128
tokens); each head is then scored on those answers with ``trainer.evaluate``, the function behind the per-epoch
held-out figures of ``train-draft``: per depth k, the share of roots whose greedy chain is right at depths
1..k, over the head's own draft vocabulary, in fp32.

    python benchmarks/head_acceptance.py --kind eagle --heads runs/eagle-a,runs/eagle-b
    python benchmarks/head_acceptance.py --kind medusa            # the shipped Medusa heads
"""

from __future__ import annotations

import argparse

import torch

import paradecode
from paradecode.benchmark.questions import default_questions_path, load_questions
from paradecode.heads.store import load_head, resolve_head_dir, target_weights
from paradecode.training.losses import DraftVocab
from paradecode.training.selfdistill import DistillConfig, answer_on_backend
from paradecode.training.trainer import TrainConfig, evaluate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=("eagle", "medusa"), required=True)
    parser.add_argument("--heads", default="", help="comma-separated head folders (default: the shipped head)")
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--depth", type=int, default=4, help="depths to score (default: 4)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = paradecode.load("smollm2-135m")
    by_category: dict[str, list] = {}
    for question in load_questions(default_questions_path()):
        by_category.setdefault(question.category, []).append(question)
    prompts = [model.encode(q.turns[0]) for category in sorted(by_category)
               for q in by_category[category][: args.per_category]]
    rows = answer_on_backend(model, prompts, DistillConfig())
    target = target_weights(str(model.model_dir))
    config = TrainConfig(kind=args.kind, eval_depth=args.depth, medusa_heads=args.depth)
    folders = [f for f in args.heads.split(",") if f] or [str(resolve_head_dir("", args.kind, "smollm2-135m"))]
    print(f"{len(rows)} answers ({args.per_category} per category)")
    for folder in folders:
        head = load_head(folder, args.kind, target)
        ids = head.draft_ids if head.draft_ids is not None else torch.arange(target.config["vocab_size"])
        to_draft = torch.full((target.config["vocab_size"],), -100)
        to_draft[ids] = torch.arange(len(ids))
        result = evaluate(head.module.float(), target, target.lm_head[ids].contiguous(), DraftVocab(ids, to_draft),
                          rows, config)
        print(folder, [round(a, 3) for a in result["acceptance"]], f"est. tokens/step {result['tau_chain']:.2f}")


if __name__ == "__main__":
    main()
