"""Training draft heads by self-distillation: prompts, data generation, losses, the loop, export (``train-draft``)."""
