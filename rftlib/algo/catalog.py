"""The built-in algorithm names, declared once: advantage estimators, reward scalings, loss
aggregations and KL estimators (the policy losses are declared beside their LossSpec in
rftlib.algo.loss_spec).

Torch-free on purpose: the config checks a name, and what a name declares, against these registries
without importing torch; the tensor functions are imported on first lookup (``REG.get``). Each entry
points at its function (``"module:attr"``); the modules that define them do not register them again.
An estimator added elsewhere (a test, a notebook) registers itself: ``@ADVANTAGES.register("name")``.
"""

from __future__ import annotations

import inspect

from rftlib.algo.registry import Registry

_ADV = "rftlib.algo.advantages"


def _takes_scale_rewards(fn) -> dict:
    """An estimator registered without declarations takes scale_rewards when its signature has it."""
    return {"scale_rewards": "scale_rewards" in inspect.signature(fn).parameters}


ADVANTAGES = Registry("advantage estimator", declarations_of=_takes_scale_rewards)
"""name -> estimator(rewards (N,), group_size, eps=..., [scale_rewards=...]) -> (N,); declares scale_rewards"""
ADVANTAGES.declare("grpo", f"{_ADV}:grpo_advantages", scale_rewards=True)
ADVANTAGES.declare("dr_grpo", f"{_ADV}:dr_grpo_advantages", scale_rewards=True)
ADVANTAGES.declare("rloo", f"{_ADV}:rloo_advantages", scale_rewards=False)
ADVANTAGES.declare("reinforce_pp_baseline", f"{_ADV}:reinforce_pp_baseline_advantages", scale_rewards=False)


def takes_scale_rewards(name: str) -> bool:
    """Whether the estimator ``name`` has a ``scale_rewards`` argument (declared; nothing imported)."""
    return bool(ADVANTAGES.decl(name).get("scale_rewards", False))


REWARD_SCALES = Registry("reward scaling")
"""name -> scale(rewards (N,), group_size) -> (N,): what (r - mean) is divided by"""
REWARD_SCALES.declare("group", f"{_ADV}:scale_group")
REWARD_SCALES.declare("batch", f"{_ADV}:scale_batch")
REWARD_SCALES.declare("none", f"{_ADV}:scale_none")

AGGREGATIONS = Registry("loss aggregation")
"""name -> agg(loss_mat, mask, *, num_seqs, num_tokens, norm_const) -> scalar (rftlib.algo.aggregation)"""
for _name, _fn in (("seq-mean-token-mean", "seq_mean_token_mean"),
                   ("seq-mean-token-sum-norm", "seq_mean_token_sum_norm"), ("token-mean", "token_mean")):
    AGGREGATIONS.declare(_name, f"rftlib.algo.aggregation:{_fn}")

SEQ_NORMS = ("nonempty", "all")  # which rows num_seqs counts; see rftlib.algo.aggregation's docstring

KL_ESTIMATORS = Registry("kl estimator")
"""name -> estimator(logprobs (N, T), ref_logprobs (N, T)) -> (N, T) (rftlib.algo.kl)"""
for _name, _fn in (("k1", "kl_k1"), ("k2", "kl_k2"), ("k3", "kl_k3"), ("k3+", "kl_k3_plus")):
    KL_ESTIMATORS.declare(_name, f"rftlib.algo.kl:{_fn}")

# estimators whose gradient as a loss term is not a KL gradient: name -> what to use instead
KL_NOT_IN_LOSS = {
    "k1": "k1 = log pi - log pi_ref has zero expected gradient as a loss term on tokens sampled from pi "
          "(E_pi[grad log pi] = 0), so it regularises nothing; use kl_estimator k3+ (k3's value, k2's gradient "
          "= the reverse KL's) or k2 in the loss, or keep k1 and set kl_in_reward: true (verl/OpenRLHF style)",
}
