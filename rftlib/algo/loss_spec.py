"""What a registered policy loss declares to the run around it: its settings class, the aggregations
it is defined under and its default aggregation.

A loss's paper fixes more than its per-token formula. GSPO and GMPO average a per-completion
quantity over completions, so only seq-mean-token-mean computes their objective (token-mean would
weight each completion by its length); CISPO normalises by the batch's token count. The loss
declares this once, here, and the config and the trainer read the declaration: neither names a loss.

A loss's own settings are a :class:`rftlib.settings.Section` dataclass: its fields (types, defaults,
``ranged`` ranges, docs), its ``rules()`` for what a declaration cannot say, and ``clip_range()``, the
(clip_low, clip_high) the loss function is called with (a clip_high of None means clip_low's)::

    @dataclass
    class MyLossSettings(Section):
        my_clip: float = ranged(0.2, gt=0, lt=1, msg="must be in (0, 1) (...)")  # its range: checked by check()

        def clip_range(self) -> tuple[float, float | None]:
            return self.my_clip, None

    @register_loss("my_loss", settings=MyLossSettings, aggregations=("token-mean",), why="...")
    def my_loss(logprobs, old_logprobs, advantages, mask, *, clip_low, clip_high, dual_clip, log_ratio_clamp):
        ...

is the whole of adding a loss (rftlib.algo.losses for the signature): ``make_config(None,
{"policy_loss": "my_loss", "my_clip": 0.3})`` then takes ``my_clip`` (held in ``RunConfig.loss_args``,
read as ``cfg.my_clip`` or ``cfg.section(MyLossSettings)``), checks it with ``MyLossSettings.check()``
and refuses it under another policy_loss; the trainer calls the loss with
``cfg.section(spec.settings).clip_range()``. A loss may also reuse a settings class (``PPOClipSettings``:
eps_clip, eps_clip_high). The built-in losses' settings classes are RunConfig sections (their fields are
RunConfig's flat fields: presets, ``-p gspo_eps_clip``).

The built-in losses are declared at the end of this module (``declare_loss``: their function's
``"module:attr"`` and the same declarations), so the config reads every loss's settings and aggregations
without importing torch; ``POLICY_LOSSES.get(name)`` imports the function on first use and returns its
LossSpec, and ``loss_spec(name)`` is the declaration alone. Pure: plain values in, no config object.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any, Callable

from rftlib.algo.registry import Registry
from rftlib.settings import CISPOSettings, GMPOSettings, GSPOSettings, PPOClipSettings, Section

AUTO = "auto"  # loss_agg_mode meaning "the policy loss's own default aggregation"


@dataclass(frozen=True)
class LossSpec:
    """A registered policy loss and what it needs; calling the spec calls the loss."""

    fn: Callable | None  # None in a declaration read before the import (loss_spec); fn(logprobs, old_logprobs, advantages, mask, *, clip_low, clip_high, dual_clip, log_ratio_clamp)
    settings: type[Section]  # its own settings: a Section dataclass with clip_range() -> (clip_low, clip_high or None)
    aggregations: tuple[str, ...] | None = None  # AGGREGATIONS modes it is defined under; None: every mode
    default_aggregation: str = "seq-mean-token-mean"  # what loss_agg_mode auto means for it (GRPO's)
    why: str = ""  # why other aggregations are refused, shown in the error
    dual_clip: bool = False  # whether it takes a dual clip (a token-level PPO device)
    token_view: Callable | str | None = None  # what its clip did to each token (below); "module:attr" or the function

    # ``token_view(logprobs, old_logprobs, advantages, mask, *, clip_low, clip_high, dual_clip, log_ratio_clamp)``
    # -> {"ratio": (N, T) the ratio the loss clips (GSPO: s_i broadcast), "clip": (N, T) int8 -1 low side / +1 high
    # side / 0 none (0 where mask is 0), and any extra (N, T) tensors}. The built-ins compute it with the same
    # function their loss calls, so the view cannot drift from the loss; rftlib.algo.token_view infers one
    # (from the gradient) for a loss that declares none.

    def __post_init__(self):
        s = self.settings
        if not (isinstance(s, type) and issubclass(s, Section) and dataclasses.is_dataclass(s)
                and callable(getattr(s, "clip_range", None))):
            raise ValueError(f"settings={s!r}: a policy loss's settings must be a @dataclass subclass of "
                             "rftlib.settings.Section with a clip_range() method returning (clip_low, clip_high)")
        for f in dataclasses.fields(s):
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"settings {s.__name__}.{f.name} has no default: every loss setting needs one "
                                 "(a config that does not set it uses the default)")
        v = self.token_view
        if not (v is None or callable(v) or (isinstance(v, str) and ":" in v)):
            raise ValueError(f"token_view={v!r}: give the view function or its 'package.module:attr', or None")
        if self.aggregations is not None and self.default_aggregation not in self.aggregations:
            raise ValueError(f"default_aggregation '{self.default_aggregation}' is not one of {self.aggregations}")

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def view_fn(self) -> Callable | None:
        """The token view function (its module imported on first use), or None when the loss declares none."""
        v = self.token_view
        if isinstance(v, str):
            module, attr = v.split(":", 1)
            return getattr(importlib.import_module(module), attr)
        return v

    def aggregation(self, mode: str) -> str:
        """The aggregation to run for loss_agg_mode ``mode``: the default for ``auto``, else ``mode``
        itself when the loss is defined under it; ValueError with the reason and the choices otherwise."""
        if mode == AUTO:
            return self.default_aggregation
        if self.aggregations is not None and mode not in self.aggregations:
            raise ValueError(f"{self.why}; use {' or '.join(self.aggregations)} (or auto)")
        return mode


def _loss_declarations(settings: type[Section], aggregations: tuple[str, ...] | None = None,
                       default_aggregation: str | None = None, why: str = "", dual_clip: bool = False,
                       token_view: Callable | str | None = None) -> dict[str, Any]:
    """LossSpec's fields but ``fn``, checked now (a bad declaration fails where it is written): ``default_aggregation``
    None means the first of ``aggregations`` (GRPO's seq-mean-token-mean when every mode is allowed)."""
    default = default_aggregation or (aggregations[0] if aggregations else "seq-mean-token-mean")
    decl = dict(settings=settings, aggregations=aggregations, default_aggregation=default, why=why, dual_clip=dual_clip,
                token_view=token_view)
    LossSpec(None, **decl)
    return decl


POLICY_LOSSES = Registry("policy loss", make=lambda name, fn, decl: LossSpec(fn, **decl))
"""name -> LossSpec (calling it calls the loss); ``decl(name)`` / :func:`loss_spec` read it without the import"""


def register_loss(name: str, *, settings: type[Section], aggregations: tuple[str, ...] | None = None,
                  default_aggregation: str | None = None, why: str = "", dual_clip: bool = False,
                  token_view: Callable | str | None = None) -> Callable:
    """Decorator: register a policy loss under ``name`` in POLICY_LOSSES with its LossSpec; the
    function is returned unchanged. ``settings``: its settings class (see the module doc);
    ``default_aggregation`` None: the first of ``aggregations`` (GRPO's seq-mean-token-mean when every
    mode is allowed); ``token_view``: its per-token ratio and clip sides (LossSpec), None: inferred."""
    decl = _loss_declarations(settings, aggregations, default_aggregation, why, dual_clip, token_view)

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


def loss_settings_owners() -> dict[str, list[str]]:
    """Each setting a registered loss's settings class declares -> the losses (sorted) whose class declares it."""
    out: dict[str, list[str]] = {}
    for name in POLICY_LOSSES.names():
        for f in dataclasses.fields(loss_spec(name).settings):
            out.setdefault(f.name, []).append(name)
    return out


# ---- the built-in losses (their functions: rftlib.algo.losses) ----------------------------------------

SEQUENCE_LEVEL = ("seq-mean-token-mean",)  # the mean over completions of a per-completion quantity


# a per-token surrogate: every aggregation is a weighting of its tokens (GRPO, Dr-GRPO and DAPO use one each)
declare_loss("ppo_clip", "rftlib.algo.losses:ppo_clip", settings=PPOClipSettings, dual_clip=True,
             token_view="rftlib.algo.losses:ppo_clip_view")
declare_loss("gspo", "rftlib.algo.losses:gspo", settings=GSPOSettings,
             aggregations=SEQUENCE_LEVEL, token_view="rftlib.algo.losses:gspo_view",
             why="GSPO's objective is the mean over completions of a length-normalised sequence ratio "
                 "(Zheng et al. 2025, eq. 5 and 13); another mode weights each completion by its length")
declare_loss("cispo", "rftlib.algo.losses:cispo", settings=CISPOSettings,
             aggregations=("token-mean", "seq-mean-token-sum-norm"), token_view="rftlib.algo.losses:cispo_view",
             why="CISPO normalises by the batch's token count (MiniMax-M1, eq. 4: 1 / sum_i |o_i|), every token "
                 "weighted the same; seq-mean-token-mean weighs a short completion's tokens more")
declare_loss("gmpo", "rftlib.algo.losses:gmpo", settings=GMPOSettings,
             aggregations=SEQUENCE_LEVEL, token_view="rftlib.algo.losses:gmpo_view",
             why="GMPO's loss is one number per completion, the geometric mean of its token ratios (Zhao et al. "
                 "2025, eq. 4), written at each of its tokens; another mode weights each completion by its length")
