"""Pure tensor math of GRPO-family RL fine-tuning: tensors in, tensors out; no I/O, no .item(),
no config objects. Every variant is a small function registered by name; the trainer looks names
up in these registries and never branches on them.

Dimensions: B prompts, G generations per prompt, N = B*G rows (prompt-major: rows i*G..i*G+G-1
are prompt i), T completion tokens, V vocabulary, H hidden size. Masks are float {0,1} ``*_mask``.

Registries here: ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS (declared in rftlib.algo.catalog), POLICY_LOSSES
(rftlib.algo.loss_spec): rftlib.algo.registry's ``Registry``, also what the other packages' registries are
made of. Declaring a name imports nothing; the tensor function is imported on first lookup. The LR
schedule (warmup + cosine, OpenRLHF's) is pure maths too: rftlib.algo.schedule.

How to add a loss (one place): its settings class (a ``@dataclass`` rftlib.settings.Section with its
fields, their ranges, and ``clip_range()``) and ``@register_loss("name", settings=..., aggregations=...,
why=...)`` on the function; no config field is written: its settings are set by name like RunConfig's
(rftlib.algo.loss_spec shows it, and declares the built-in ones with ``declare_loss``;
tests/test_algo_loss_spec.py registers a toy one with its own clip, toy_clip).
"""

import importlib

# name -> module that defines it: imported on first access (PEP 562), so importing a torch-free module of
# this package (registry, catalog, loss_spec, schedule) does not import torch through this __init__
_WHERE = {
    **dict.fromkeys(("ADVANTAGES", "REWARD_SCALES"), "catalog"),
    **dict.fromkeys(("advantage_stats", "compute_advantages"), "advantages"),
    **dict.fromkeys(("AGGREGATIONS", "SEQ_NORMS", "KL_ESTIMATORS", "KL_NOT_IN_LOSS"), "catalog"),
    **dict.fromkeys(("aggregate", "batch_totals", "masked_max", "masked_mean", "masked_min", "masked_quantile"),
                    "aggregation"),
    **dict.fromkeys(("constant_groups", "group_row_mask", "untruncated_mask"), "filtering"),
    "kl_penalty": "kl",
    **dict.fromkeys(("chunked_logprobs_entropy", "full_logprobs_entropy"), "logprobs"),
    **dict.fromkeys(("LossSpec", "POLICY_LOSSES", "register_loss"), "loss_spec"),
    **dict.fromkeys(("cispo", "gmpo", "grpo_loss", "gspo", "ppo_clip"), "losses"),
    "Registry": "registry",
    **dict.fromkeys(("kl_in_reward", "kl_tokens", "overlong_penalty"), "shaping"),
}


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'rftlib.algo' has no attribute '{name}'")
    return getattr(importlib.import_module(f"rftlib.algo.{_WHERE[name]}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))


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
