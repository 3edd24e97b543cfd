"""Pure tensor math of GRPO-family RL fine-tuning: tensors in, tensors out; no I/O, no .item(),
no config objects. Every variant is a small function registered by name; the trainer looks names
up in these registries and never branches on them.

Dimensions: B prompts, G generations per prompt, N = B*G rows (prompt-major: rows i*G..i*G+G-1
are prompt i), T completion tokens, V vocabulary, H hidden size. Masks are float {0,1} ``*_mask``.
"""

from rftlib.algo.advantages import ADVANTAGES, advantage_stats, compute_advantages
from rftlib.algo.aggregation import AGGREGATIONS, aggregate, masked_max, masked_mean, masked_min, masked_quantile
from rftlib.algo.kl import KL_ESTIMATORS, kl_penalty
from rftlib.algo.logprobs import chunked_logprobs_entropy, full_logprobs_entropy
from rftlib.algo.losses import POLICY_LOSSES, grpo_loss, ppo_clip
from rftlib.algo.registry import Registry

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "Registry",
    "advantage_stats",
    "aggregate",
    "chunked_logprobs_entropy",
    "compute_advantages",
    "full_logprobs_entropy",
    "grpo_loss",
    "kl_penalty",
    "masked_max",
    "masked_mean",
    "masked_min",
    "masked_quantile",
    "ppo_clip",
]
