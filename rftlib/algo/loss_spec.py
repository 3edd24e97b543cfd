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

is the whole of adding a loss (rftlib.algo.losses for the signature; the built-in losses register
when that module is imported). Pure: plain values in, no config object (``validate`` gets the
run's settings as a name -> value mapping).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from rftlib.algo.registry import Registry

POLICY_LOSSES = Registry("policy loss")

AUTO = "auto"  # loss_agg_mode meaning "the policy loss's own default aggregation"


def _no_checks(values: Mapping[str, Any]) -> list[str]:
    return []


@dataclass(frozen=True)
class LossSpec:
    """A registered policy loss and what it needs; calling the spec calls the loss."""

    fn: Callable  # fn(logprobs, old_logprobs, advantages, mask, *, clip_low, clip_high, dual_clip, log_ratio_clamp)
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


def register_loss(name: str, *, clip_fields: tuple[str, str], aggregations: tuple[str, ...] | None = None,
                  default_aggregation: str | None = None, why: str = "", dual_clip: bool = False,
                  validate: Callable[[Mapping[str, Any]], list[str]] = _no_checks) -> Callable:
    """Decorator: register a policy loss under ``name`` in POLICY_LOSSES with its LossSpec; the
    function is returned unchanged. ``default_aggregation`` None: the first of ``aggregations``
    (GRPO's seq-mean-token-mean when every mode is allowed)."""
    default = default_aggregation or (aggregations[0] if aggregations else "seq-mean-token-mean")

    def add(fn: Callable) -> Callable:
        POLICY_LOSSES.add(name, LossSpec(fn, clip_fields, aggregations, default, why, dual_clip, validate))
        return fn

    return add
