"""Pure tensor math of GRPO-family RL fine-tuning: tensors in, tensors out; no I/O, no .item(),
no config objects. Every variant is a small function registered by name; the trainer looks names
up in these registries and never branches on them.

Dimensions: B prompts, G generations per prompt, N = B*G rows (prompt-major: rows i*G..i*G+G-1
are prompt i), T completion tokens, V vocabulary, H hidden size. Masks are float {0,1} ``*_mask``.

Registries here: ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES (rftlib.algo.registry's
``Registry``, also what the other packages' registries are made of). The LR schedule (warmup +
cosine, OpenRLHF's) is pure maths too: rftlib.algo.schedule.

How to add a loss (one place): ``@register_loss("name", clip_fields=..., aggregations=..., why=...)`` on
the function (rftlib.algo.loss_spec shows it; tests/test_algo_loss_spec.py registers a toy one).
"""

from rftlib.algo.advantages import ADVANTAGES, REWARD_SCALES, advantage_stats, compute_advantages
from rftlib.algo.aggregation import (
    AGGREGATIONS,
    SEQ_NORMS,
    aggregate,
    batch_totals,
    masked_max,
    masked_mean,
    masked_min,
    masked_quantile,
)
from rftlib.algo.filtering import constant_groups, group_row_mask, untruncated_mask
from rftlib.algo.kl import KL_ESTIMATORS, KL_NOT_IN_LOSS, kl_penalty
from rftlib.algo.logprobs import chunked_logprobs_entropy, full_logprobs_entropy
from rftlib.algo.loss_spec import LossSpec, register_loss
from rftlib.algo.losses import POLICY_LOSSES, cispo, gmpo, grpo_loss, gspo, ppo_clip
from rftlib.algo.registry import Registry
from rftlib.algo.shaping import kl_in_reward, kl_tokens, overlong_penalty

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "KL_NOT_IN_LOSS",
    "LossSpec",
    "POLICY_LOSSES",
    "REWARD_SCALES",
    "Registry",
    "SEQ_NORMS",
    "advantage_stats",
    "aggregate",
    "batch_totals",
    "chunked_logprobs_entropy",
    "cispo",
    "compute_advantages",
    "constant_groups",
    "full_logprobs_entropy",
    "gmpo",
    "group_row_mask",
    "grpo_loss",
    "gspo",
    "kl_in_reward",
    "kl_penalty",
    "kl_tokens",
    "overlong_penalty",
    "masked_max",
    "masked_mean",
    "masked_min",
    "masked_quantile",
    "ppo_clip",
    "register_loss",
    "untruncated_mask",
]
