"""What a registered policy loss declares to the run around it: its clip fields, the aggregations it
is defined under, its default aggregation and the checks of its own settings.

A loss's paper fixes more than its per-token formula. GSPO and GMPO average a per-completion
quantity over completions, so only seq-mean-token-mean computes their objective (token-mean would
weight each completion by its length); CISPO normalises by the batch's token count. The loss
declares this once, here, and the config and the trainer read the declaration: neither names a loss.

    @register_loss("my_loss", clip_fields=("eps_clip", "eps_clip_high"), aggregations=("token-mean",),
                   why="...")
    def my_loss(logprobs, old_logprobs, advantages, mask, *, clip_low, clip_high, dual_clip, log_ratio_clamp):
        ...

is the whole of adding a loss (rftlib.algo.losses for the signature). The built-in losses are
declared at the end of this module (``declare_loss``: their function's ``"module:attr"`` and the same
declarations), so the config reads every loss's clip fields, aggregations and checks without importing
torch; ``POLICY_LOSSES.get(name)`` imports the function on first use and returns its LossSpec, and
``loss_spec(name)`` is the declaration alone. Pure: plain values in, no config object (``validate``
gets the run's settings as a name -> value mapping).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from rftlib.algo.registry import Registry

AUTO = "auto"  # loss_agg_mode meaning "the policy loss's own default aggregation"


def _no_checks(values: Mapping[str, Any]) -> list[str]:
    return []


@dataclass(frozen=True)
class LossSpec:
    """A registered policy loss and what it needs; calling the spec calls the loss."""

    fn: Callable | None  # None in a declaration read before the import (loss_spec); fn(logprobs, old_logprobs, advantages, mask, *, clip_low, clip_high, dual_clip, log_ratio_clamp)
    clip_fields: tuple[str, str]  # settings of (clip_low, clip_high); a clip_high setting of None means clip_low's
    aggregations: tuple[str, ...] | None = None  # AGGREGATIONS modes it is defined under; None: every mode
    default_aggregation: str = "seq-mean-token-mean"  # what loss_agg_mode auto means for it (GRPO's)
    why: str = ""  # why other aggregations are refused, shown in the error
    dual_clip: bool = False  # whether it takes a dual clip (a token-level PPO device)
    validate: Callable[[Mapping[str, Any]], list[str]] = field(default=_no_checks)
    """the problems with its own settings, each a message naming the setting ("gspo_eps_clip=0: ..."); [] if none"""

    def __post_init__(self):
        if self.aggregations is not None and self.default_aggregation not in self.aggregations:
            raise ValueError(f"default_aggregation '{self.default_aggregation}' is not one of {self.aggregations}")

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def aggregation(self, mode: str) -> str:
        """The aggregation to run for loss_agg_mode ``mode``: the default for ``auto``, else ``mode``
        itself when the loss is defined under it; ValueError with the reason and the choices otherwise."""
        if mode == AUTO:
            return self.default_aggregation
        if self.aggregations is not None and mode not in self.aggregations:
            raise ValueError(f"{self.why}; use {' or '.join(self.aggregations)} (or auto)")
        return mode


def _loss_declarations(clip_fields: tuple[str, str], aggregations: tuple[str, ...] | None = None,
                       default_aggregation: str | None = None, why: str = "", dual_clip: bool = False,
                       validate: Callable[[Mapping[str, Any]], list[str]] = _no_checks) -> dict[str, Any]:
    """LossSpec's fields but ``fn``: ``default_aggregation`` None means the first of ``aggregations`` (GRPO's
    seq-mean-token-mean when every mode is allowed)."""
    default = default_aggregation or (aggregations[0] if aggregations else "seq-mean-token-mean")
    return dict(clip_fields=clip_fields, aggregations=aggregations, default_aggregation=default, why=why,
                dual_clip=dual_clip, validate=validate)


POLICY_LOSSES = Registry("policy loss", make=lambda name, fn, decl: LossSpec(fn, **decl))
"""name -> LossSpec (calling it calls the loss); ``decl(name)`` / :func:`loss_spec` read it without the import"""


def register_loss(name: str, *, clip_fields: tuple[str, str], aggregations: tuple[str, ...] | None = None,
                  default_aggregation: str | None = None, why: str = "", dual_clip: bool = False,
                  validate: Callable[[Mapping[str, Any]], list[str]] = _no_checks) -> Callable:
    """Decorator: register a policy loss under ``name`` in POLICY_LOSSES with its LossSpec; the
    function is returned unchanged. ``default_aggregation`` None: the first of ``aggregations``
    (GRPO's seq-mean-token-mean when every mode is allowed)."""
    decl = _loss_declarations(clip_fields, aggregations, default_aggregation, why, dual_clip, validate)

    def add(fn: Callable) -> Callable:
        POLICY_LOSSES.add(name, fn, **decl)
        return fn

    return add


def declare_loss(name: str, target: str, **declarations: Any) -> None:
    """Declare a loss by its function's ``"module:attr"`` (imported on first ``POLICY_LOSSES.get``) with
    register_loss's keyword arguments."""
    POLICY_LOSSES.declare(name, target, **_loss_declarations(**declarations))


def loss_spec(name: str) -> LossSpec:
    """What the loss ``name`` declares (its LossSpec without the function: nothing is imported)."""
    return LossSpec(None, **POLICY_LOSSES.decl(name))


# ---- the built-in losses (their functions: rftlib.algo.losses) ----------------------------------------

SEQUENCE_LEVEL = ("seq-mean-token-mean",)  # the mean over completions of a per-completion quantity


def _ppo_clip_settings(v) -> list[str]:
    out = []
    if not 0 < v["eps_clip"] < 1:
        out.append(f"eps_clip={v['eps_clip']}: must be in (0, 1) (seed 003 uses 0.1-0.2)")
    if v["eps_clip_high"] is not None and v["eps_clip_high"] <= 0:
        out.append(f"eps_clip_high={v['eps_clip_high']}: must be > 0 (DAPO's clip-higher uses 0.28)")
    return out


def _gspo_settings(v) -> list[str]:
    return [f"{k}={v[k]}: must be in (0, 1) (GSPO's sequence-ratio range, paper: 3e-4 / 4e-4)"
            for k in ("gspo_eps_clip", "gspo_eps_clip_high") if not 0 < v[k] < 1]


def _cispo_settings(v) -> list[str]:
    out = []
    if not 0 <= v["cispo_eps_clip"] <= 1:
        out.append(f"cispo_eps_clip={v['cispo_eps_clip']}: must be in [0, 1] "
                   "(1: no floor on the IS weight, as MiniMax-M1)")
    if not v["cispo_eps_clip_high"] > 0:
        out.append(f"cispo_eps_clip_high={v['cispo_eps_clip_high']}: must be > 0 (the IS-weight ceiling is 1 + this)")
    return out


def _gmpo_settings(v) -> list[str]:
    if not v["gmpo_eps_clip"] > 0:
        return [f"gmpo_eps_clip={v['gmpo_eps_clip']}: must be > 0 (a log-ratio bound; GMPO's paper uses 0.4)"]
    return []


# a per-token surrogate: every aggregation is a weighting of its tokens (GRPO, Dr-GRPO and DAPO use one each)
declare_loss("ppo_clip", "rftlib.algo.losses:ppo_clip", clip_fields=("eps_clip", "eps_clip_high"), dual_clip=True,
             validate=_ppo_clip_settings)
declare_loss("gspo", "rftlib.algo.losses:gspo", clip_fields=("gspo_eps_clip", "gspo_eps_clip_high"),
             aggregations=SEQUENCE_LEVEL, validate=_gspo_settings,
             why="GSPO's objective is the mean over completions of a length-normalised sequence ratio "
                 "(Zheng et al. 2025, eq. 5 and 13); another mode weights each completion by its length")
declare_loss("cispo", "rftlib.algo.losses:cispo", clip_fields=("cispo_eps_clip", "cispo_eps_clip_high"),
             aggregations=("token-mean", "seq-mean-token-sum-norm"), validate=_cispo_settings,
             why="CISPO normalises by the batch's token count (MiniMax-M1, eq. 4: 1 / sum_i |o_i|), every token "
                 "weighted the same; seq-mean-token-mean weighs a short completion's tokens more")
declare_loss("gmpo", "rftlib.algo.losses:gmpo", clip_fields=("gmpo_eps_clip", "gmpo_eps_clip"),
             aggregations=SEQUENCE_LEVEL, validate=_gmpo_settings,
             why="GMPO's loss is one number per completion, the geometric mean of its token ratios (Zhao et al. "
                 "2025, eq. 4), written at each of its tokens; another mode weights each completion by its length")
