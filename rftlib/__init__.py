"""rftlib: a notebook-first research workbench for GRPO-family RL fine-tuning of language models.

Dimension names used throughout (fixed once here):
    B  prompts per rollout        G  generations per prompt     N = B*G rows, prompt-major
    P  prompt tokens (left-padded) T  completion tokens         V  vocabulary size
Rows i*G .. i*G+G-1 belong to prompt i. Masks are float {0,1} named ``*_mask``.
"""

__version__ = "0.1.0"
