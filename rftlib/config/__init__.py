"""One flat ``RunConfig`` for an attempt, composed of the section dataclasses of rftlib.settings (their
fields, docs, defaults, choices and ranges live there); presets in ``params/*.yaml`` hold overrides.

Flat to the user on purpose: the same names are papermill parameters (``-p eps_clip 0.1``), CLI flags
(``--eps_clip 0.1``) and YAML keys, as researchers already use them with OpenRLHF's flags. Sectioned
to the code: a lower layer receives ``cfg.section(RolloutSettings)``, not the whole config. This module
adds what needs the registries (names of losses, tasks, engines, backends and their declared rules),
the rules across sections, the values derived from several fields (``total_optimizer_steps`` ...),
and reading presets. Importing it imports no torch (tests/test_config_light.py).

Resolution order: dataclass defaults <- preset YAML (``params/<name>.yaml``) <- overrides.
Unknown keys are errors listing near matches; impossible settings are errors saying what to change.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import math
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

# every registry below is torch-free: a name and what it declares are read without importing the tensor code,
# the engines or the backends (tests/test_config_light.py runs `import rftlib.config` and checks)
from rftlib.algo.catalog import (ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, KL_NOT_IN_LOSS, REWARD_SCALES,
                                 takes_scale_rewards)
from rftlib.algo.loss_spec import AUTO, POLICY_LOSSES, loss_settings_owners, loss_spec
from rftlib.algo.schedule import lr_at, warmup_steps_for
from rftlib.data.base import registered_rewards, registered_tasks
from rftlib.envs.base import ENVS
from rftlib.monitor.trackers import TRACKERS
from rftlib.rewards.registry import TASK_REWARD
from rftlib.rollout.kinds import ENGINES, EngineInputs, engine_kind
from rftlib.settings import (SECTIONS, AlgorithmSettings, AttemptSettings, CISPOSettings, EngineSettings, EvalLogSettings,
                             GMPOSettings, GSPOSettings, LaunchSettings, LossSettings, ModelSettings, OptimizationSettings,
                             PPOClipSettings, RolloutSettings, ScaleSettings, SeedScheduleSettings, ShapingSettings,
                             TaskSettings, declared_problems)
from rftlib.backends import BACKENDS, BackendInputs, check_config as backend_rules

S = typing.TypeVar("S")

PARAMS_DIR = Path(__file__).resolve().parent.parent.parent / "params"


class ConfigError(ValueError):
    """A bad parameter, preset or combination of settings; the message says what to change."""


@dataclass
class RunConfig(LaunchSettings, EngineSettings, ScaleSettings, SeedScheduleSettings, EvalLogSettings,
                OptimizationSettings, ShapingSettings, GMPOSettings, CISPOSettings, GSPOSettings, LossSettings,
                PPOClipSettings, AlgorithmSettings, RolloutSettings, TaskSettings, ModelSettings, AttemptSettings):
    """Every setting of an attempt, flat: the sections of rftlib.settings in one class.

    The bases are listed last section first, so that the fields come in SECTIONS' order (a dataclass
    collects its fields from its bases in reverse MRO): ``to_dict()``, the YAML keys and train.ipynb's
    parameters cell keep the order they had when this was one class. A lower layer gets its own
    section, a real instance holding only its fields: ``cfg.section(RolloutSettings)``.

    A loss registered outside rftlib.settings (a test's, a user's) declares its own settings class; the
    values given for its fields are held in ``loss_args`` and read as the other fields are: ``cfg.toy_clip``
    (the settings class's default when not given) and ``cfg.section(ToySettings)``.
    """

    loss_args: dict = field(default_factory=dict)
    """the settings of a registered policy loss that are not RunConfig fields (its settings class declares them;
    rftlib.algo.loss_spec), as given: {name: value}. Written flat by to_dict and read flat by make_config
    (``toy_clip: 0.3``), so it is no parameter of its own"""

    def __getattr__(self, name: str) -> Any:
        """A registered loss's own setting that is not a RunConfig field: its value in loss_args, else its
        settings class's default. Called only when ``name`` is not a field or attribute."""
        if name.startswith("_") or name == "loss_args":  # copy / pickle probe dunders before __init__ ran
            raise AttributeError(name)
        args = self.__dict__.get("loss_args") or {}
        if name in args:
            return args[name]
        for loss in loss_settings_owners().get(name, ()):
            f = {f.name: f for f in fields(loss_spec(loss).settings)}[name]
            return f.default_factory() if f.default is dataclasses.MISSING else f.default
        raise AttributeError(f"'RunConfig' object has no attribute '{name}'")

    def rules(self) -> list[str]:
        """Every section's own rules (a section's ``rules`` sees only its fields; RunConfig is every section)."""
        return [msg for cls in SECTIONS for msg in cls.rules(self)]  # type: ignore[arg-type]

    def section(self, cls: type[S]) -> S:
        """This config's values of section ``cls`` (a new ``cls`` instance: what a lower layer receives)."""
        return cls(**{f.name: getattr(self, f.name) for f in fields(cls)})

    @property
    def train_prompts(self) -> int:
        """Prompts per optimizer step (train_batch_size, or the whole rollout)."""
        return self.train_batch_size or self.rollout_batch_size

    @property
    def optimizer_steps_per_rollout(self) -> int:
        """PPO epochs x optimizer batches per rollout; 1 means exactly on-policy."""
        return self.num_updates_per_rollout * (self.rollout_batch_size // self.train_prompts)

    @property
    def total_optimizer_steps(self) -> int:
        """Optimizer steps of the whole attempt: what the LR schedule (and its warmup) is laid over. The one
        place this is computed: the trainer, the backends, the preflight and the schedule table read it."""
        return self.num_steps * self.optimizer_steps_per_rollout

    @property
    def warmup_steps(self) -> int:
        """Linear-warmup optimizer steps: warmup_ratio of total_optimizer_steps (rftlib.algo.schedule)."""
        return warmup_steps_for(self.total_optimizer_steps, self.warmup_ratio)

    @property
    def needs_reference(self) -> bool:
        """A frozen reference policy is needed: a KL term (in the loss or in the reward) has beta > 0."""
        return self.beta > 0

    @property
    def kl_in_loss(self) -> bool:
        """The KL term is in the loss (beta > 0 and not kl_in_reward, which subtracts it from the reward)."""
        return self.beta > 0 and not self.kl_in_reward

    @property
    def on_policy(self) -> bool:
        """Every sample is trained on by the weights that generated it: one optimizer step per rollout and an
        engine that samples from the trainer's own module (else the trainer computes old logprobs, and TIS)."""
        return self.optimizer_steps_per_rollout == 1 and engine_kind(self.rollout_engine).on_trainer_module


def config_fields() -> dict[str, dataclasses.Field]:
    """The parameters: RunConfig's fields but loss_args (a store of registered losses' own settings, set by name)."""
    return {f.name: f for f in fields(RunConfig) if f.name != "loss_args"}


def value_from_text(name: str, text: str) -> Any:
    """A field's value as typed on a command line (``--set``, ``--vary``): YAML (1e-3, true, [a, b]),
    except for text fields (notes, name, ...), which keep the string as typed ("A: eps 0.2" is not a mapping)."""
    hint = typing.get_type_hints(RunConfig).get(name)
    keep = hint in (str, str | None) or (typing.get_origin(hint) is typing.Literal
                                         and all(isinstance(a, str) for a in typing.get_args(hint)))
    return text if keep else yaml.safe_load(text)  # a Literal of names: "on" stays "on" (YAML would say True)


def field_docs() -> dict[str, str]:
    """Each field's one-line doc, read from the attribute docstrings in rftlib.settings' source (and RunConfig's
    own: loss_args)."""
    docs: dict[str, str] = {}
    for cls in (*SECTIONS, RunConfig):
        body = ast.parse(inspect.getsource(cls)).body[0].body  # type: ignore[attr-defined]
        for node, nxt in zip(body, body[1:]):
            if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
                docs[node.target.id] = str(nxt.value.value)  # type: ignore[union-attr]
    return docs


def _unknown(key: str, where: str) -> ConfigError:
    names = list(config_fields()) + [k for k in loss_settings_owners() if k not in config_fields()]
    near = difflib.get_close_matches(key, names, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(near)}?" if near else f"; valid names: {', '.join(names)}"
    return ConfigError(f"unknown parameter '{key}' in {where}{hint}")


def _allowed_types(tp: Any) -> tuple[type, ...]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        out: tuple[type, ...] = ()
        for a in typing.get_args(tp):
            out += _allowed_types(a)
        return out
    if tp is type(None):
        return (type(None),)
    if origin is typing.Literal:  # the choices' own types; membership is the declared check's (rftlib.settings)
        return tuple(dict.fromkeys(type(a) for a in typing.get_args(tp)))
    return (origin or tp,)


def _tname(tp: Any) -> str:
    return getattr(tp, "__name__", None) if isinstance(tp, type) else str(tp).replace("typing.", "")


def _coerce(name: str, value: Any, where: str, owner: type = RunConfig) -> Any:
    """Check a value's type against the field's (of ``owner``: a registered loss's settings class for its own
    settings); ints are accepted for floats; CLI strings are parsed."""
    hints = typing.get_type_hints(owner)
    allowed = _allowed_types(hints[name])
    if isinstance(value, str) and str not in allowed:
        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError:
            pass
    if float in allowed and isinstance(value, str):
        try:
            value = float(value)  # PyYAML reads 1e-4 (no dot) as a string; researchers write it anyway
        except ValueError:
            pass
    if float in allowed and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if isinstance(value, bool) and bool not in allowed:
        raise ConfigError(f"parameter '{name}' in {where}: expected {_tname(hints[name])}, got bool {value!r}")
    if list in allowed and isinstance(value, (tuple, str)):
        value = list(value) if isinstance(value, tuple) else [s.strip() for s in value.split(",") if s.strip()]
    if not isinstance(value, allowed):
        raise ConfigError(
            f"parameter '{name}' in {where}: expected {_tname(hints[name])}, got {type(value).__name__} {value!r}"
        )
    return value


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a preset; malformed YAML is an error naming the file and line."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        presets = sorted(p.stem for p in PARAMS_DIR.glob("*.yaml"))
        raise ConfigError(f"preset file not found: {path} (presets in params/: {', '.join(presets)})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "context_mark", None) or getattr(e, "problem_mark", None)
        loc = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        line = text.splitlines()[mark.line] if mark and mark.line < len(text.splitlines()) else ""
        what = " ".join(x for x in (getattr(e, "context", None), getattr(e, "problem", None)) if x) or str(e)
        raise ConfigError(f"malformed YAML at {loc}: {what}" + (f"\n    {line}" if line else "")) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a preset must be a mapping of parameter: value, got {type(data).__name__}")
    return data


def resolve_preset(preset: str | Path) -> Path:
    """A preset name (``default``) or a path to a YAML file."""
    p = Path(preset)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return p
    return PARAMS_DIR / f"{preset}.yaml"


def make_config(preset: str | Path | None = None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Defaults <- preset <- overrides, type-checked and validated."""
    values: dict[str, Any] = {}
    known = config_fields()
    loss_args: dict[str, Any] = {}

    def put(k: str, v: Any, where: str) -> None:
        if k in known:
            values[k] = _coerce(k, v, where)
        elif k == "loss_args" and isinstance(v, dict):  # RunConfig's own store, e.g. from a dict of its fields
            for a, x in v.items():
                put(a, x, f"{where} loss_args")
        else:  # a registered loss's own setting (its settings class declares it), held in loss_args
            _put_loss_arg(loss_args, k, v, where)

    if preset is not None:
        path = resolve_preset(preset)
        for k, v in load_yaml(path).items():
            put(k, v, str(path))
    for k, v in (overrides or {}).items():
        put(k, v, "overrides")
    if loss_args:
        values["loss_args"] = loss_args
    _derive_schedule(values)
    _mirror_reward_mode(values)
    cfg = RunConfig(**values)
    validate(cfg)
    return cfg


def _put_loss_arg(loss_args: dict[str, Any], key: str, value: Any, where: str) -> None:
    """Store ``key``, a setting of a registered loss's own settings class, type-checked against that class;
    ConfigError listing near matches when no registered loss declares it. Whether ``policy_loss`` is its
    loss, and its range, are checked with the config (``_validate_policy_loss``)."""
    owners = loss_settings_owners().get(key)
    if not owners:
        raise _unknown(key, where)
    v = _coerce(key, value, where, owner=loss_spec(owners[0]).settings)
    if isinstance(v, float) and not math.isfinite(v):
        raise ConfigError(f"{key}={v}: must be a finite number (NaN and inf are refused)")
    loss_args[key] = v


def _derive_schedule(values: dict[str, Any]) -> None:
    """Fill train_batch_size and num_steps from the OpenRLHF-style fields, in place.

    ``train_batch_size_samples`` (samples) -> ``train_batch_size`` (prompts, what the trainer reads);
    ``pool_size`` and ``num_episodes`` -> ``num_steps`` (rollout steps). A value given both ways
    must agree: a preset never says two different schedules.
    """
    d = {f.name: f.default for f in fields(RunConfig) if f.default is not dataclasses.MISSING}
    get = lambda k: values.get(k, d.get(k))  # noqa: E731
    G, tbs = get("n_samples_per_prompt"), get("train_batch_size_samples")
    if tbs is not None and isinstance(G, int) and G >= 1 and tbs >= 1:
        if tbs % G:
            raise ConfigError(f"train_batch_size_samples={tbs} is not a whole number of prompts at "
                              f"n_samples_per_prompt={G}; use a multiple of {G}")
        if values.get("train_batch_size") not in (None, tbs // G):
            raise ConfigError(f"train_batch_size={values['train_batch_size']} (prompts) disagrees with "
                              f"train_batch_size_samples={tbs} = {tbs // G} prompts x {G}; give one of them")
        values["train_batch_size"] = tbs // G
    pool, ep, rbs = get("pool_size"), get("num_episodes"), get("rollout_batch_size")
    if (pool is None) != (ep is None):
        raise ConfigError("pool_size and num_episodes go together (rollout steps = pool_size // "
                          "rollout_batch_size x num_episodes); give both, or num_steps alone")
    if pool is not None and pool >= 1 and ep >= 1 and isinstance(rbs, int) and rbs >= 1:
        if pool < rbs:
            raise ConfigError(f"pool_size={pool} is smaller than one rollout of rollout_batch_size={rbs} prompts")
        steps = pool // rbs * ep
        if "num_steps" in values and values["num_steps"] != steps:
            raise ConfigError(f"num_steps={values['num_steps']} disagrees with pool_size={pool} // "
                              f"rollout_batch_size={rbs} x num_episodes={ep} = {steps} rollout steps; "
                              "give num_steps alone (num_episodes: null) or the episodes alone")
        values["num_steps"] = steps


def _mirror_reward_mode(values: dict[str, Any]) -> None:
    """Carry ``reward_mode`` to the task builder through ``task_args`` (what the trainer passes on).

    The field is the source of truth when given; a ``task_args.reward_mode`` alone is adopted as the
    field. Only builders that take ``reward_mode`` (the math tasks) get it; ``exact`` is their
    default, so it is not written.
    """
    args = dict(values.get("task_args") or {})
    if "reward_mode" not in values and "reward_mode" in args:
        values["reward_mode"] = args["reward_mode"]
    mode = values.get("reward_mode", "exact")
    args.pop("reward_mode", None)
    if mode != "exact" and _task_takes(values.get("task", RunConfig.task), "reward_mode"):
        args["reward_mode"] = mode
    if args or "task_args" in values:
        values["task_args"] = args


def _task_takes(task: str, arg: str) -> bool:
    """Whether the registered builder of ``task`` takes ``arg`` (False for an unknown task)."""
    tasks = registered_tasks()
    if task not in tasks:
        return False
    params = inspect.signature(tasks.get(task)).parameters
    return arg in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def schedule(cfg: RunConfig, check_step: int = 20) -> dict[str, Any]:
    """The schedule this config runs: rollouts, optimizer steps, warmup steps, LR at ``check_step``.

    ``lr_at_check`` is the LR after ``check_step`` optimizer steps (seed 003's preflight checks step
    20); None when the run is shorter than that.
    """
    total, warmup = cfg.total_optimizer_steps, cfg.warmup_steps
    at = (lr_at(check_step, total_steps=total, warmup_steps=warmup, lr=cfg.lr, min_lr_ratio=cfg.min_lr_ratio)
          if check_step < total else None)
    return {"rollouts": cfg.num_steps, "optimizer_steps": total, "warmup_steps": warmup,
            "optimizer_steps_per_rollout": cfg.optimizer_steps_per_rollout, "lr": cfg.lr,
            f"lr_at_{check_step}": at}


def validate(cfg: RunConfig) -> None:
    """Refuse impossible settings with a message that says what to change (the first problem found).

    In order: what the fields declare (rftlib.settings: Literal choices, ranges, finite floats), each
    section's own rules, then the rules across sections and the names checked against the registries.
    """
    def bad(msg: str) -> None:
        raise ConfigError(msg)

    for msg in declared_problems(cfg):
        bad(msg)
    for msg in cfg.rules():
        bad(msg)
    G = cfg.n_samples_per_prompt
    tb = cfg.train_prompts
    if tb < 1 or cfg.rollout_batch_size % tb:
        bad(f"train_batch_size={tb} must divide rollout_batch_size={cfg.rollout_batch_size} "
            "(each rollout is split into whole optimizer batches)")
    if cfg.micro_batch_size < 1 or (tb * G) % cfg.micro_batch_size:
        bad(f"micro_batch_size={cfg.micro_batch_size} must divide train_batch_size x n_samples_per_prompt "
            f"= {tb} x {G} = {tb * G} sequences")
    for name, reg in (("advantage_estimator", ADVANTAGES), ("kl_estimator", KL_ESTIMATORS),
                      ("policy_loss", POLICY_LOSSES)):
        value = getattr(cfg, name)
        if value not in reg:
            bad(f"{name}='{value}': valid values are {', '.join(reg.names())}")
    if cfg.loss_agg_mode != AUTO and cfg.loss_agg_mode not in AGGREGATIONS:
        bad(f"loss_agg_mode='{cfg.loss_agg_mode}': valid values are {', '.join(AGGREGATIONS.names())} "
            "(or auto: the policy loss's own)")
    tasks = registered_tasks()
    if cfg.task not in tasks:
        bad(f"task='{cfg.task}': valid tasks are {', '.join(tasks.names())}")
    params = inspect.signature(tasks.get(cfg.task)).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        bad_args = sorted(set(cfg.task_args) - set(params))
        if bad_args:
            bad(f"task_args {bad_args} are not arguments of task '{cfg.task}'; it takes: "
                f"{', '.join(k for k in params if k != 'eval_size') or '(none)'}")
    off_policy = cfg.num_updates_per_rollout > 1 or tb != cfg.rollout_batch_size
    if cfg.lora_dropout > 0 and off_policy:
        bad(f"lora_dropout={cfg.lora_dropout} with off-policy updates: the old logprobs (no dropout) and the "
            "policy's (a fresh dropout mask) differ before any update, so PPO clips on dropout noise; "
            "set lora_dropout 0 (the GRPO default) or one exactly on-policy update per rollout")
    if cfg.init_adapter is not None and cfg.needs_reference:
        bad("init_adapter with beta > 0: the KL reference would be the base model (adapter disabled), not the "
            "starting SFT policy; merge the adapter into the base model and start a fresh LoRA, or set beta 0")
    _validate_scale(cfg, bad)
    _validate_seed_schedule(cfg, bad)
    _validate_algo(cfg, bad)
    _validate_trackers(cfg, bad)
    _validate_rewards(cfg, bad)


def _validate_rewards(cfg: RunConfig, bad) -> None:
    """rewards names registered rewards (or 'task') with finite numeric weights."""
    known = registered_rewards()
    for name, w in cfg.rewards.items():
        if name != TASK_REWARD and name not in known:
            bad(f"rewards: unknown reward '{name}'; valid: {TASK_REWARD}, {', '.join(known.names())}")
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w):
            bad(f"rewards[{name!r}]={w!r}: a weight must be a finite number")


def _validate_trackers(cfg: RunConfig, bad) -> None:
    """report_to names registered trackers, each once (rftlib.monitor.trackers)."""
    unknown = [t for t in cfg.report_to if t not in TRACKERS]
    if unknown or len(set(cfg.report_to)) != len(cfg.report_to):
        bad(f"report_to={cfg.report_to}: name each tracker once, from {', '.join(TRACKERS.names())} ([] for none)")


def _validate_seed_schedule(cfg: RunConfig, bad) -> None:
    """The OpenRLHF-style schedule fields, per-probe eval settings and the reward mode."""
    G = cfg.n_samples_per_prompt
    if cfg.train_batch_size_samples is not None and cfg.train_batch_size_samples != cfg.train_prompts * G:
        bad(f"train_batch_size_samples={cfg.train_batch_size_samples} but train_batch_size x "
            f"n_samples_per_prompt = {cfg.train_prompts} x {G} = {cfg.train_prompts * G}; give one of them")
    if (cfg.pool_size is None) != (cfg.num_episodes is None):
        bad("pool_size and num_episodes go together; give both, or num_steps alone")
    if cfg.pool_size is not None:
        if cfg.pool_size < cfg.rollout_batch_size:
            bad(f"pool_size={cfg.pool_size} is smaller than one rollout of rollout_batch_size="
                f"{cfg.rollout_batch_size} prompts")
        steps = cfg.pool_size // cfg.rollout_batch_size * cfg.num_episodes
        if cfg.num_steps != steps:
            bad(f"num_steps={cfg.num_steps} but pool_size={cfg.pool_size} // rollout_batch_size="
                f"{cfg.rollout_batch_size} x num_episodes={cfg.num_episodes} = {steps}; give one of them")
    for name in ("eval_temperature", "eval_n_samples"):
        unknown = sorted(set(getattr(cfg, name)) - set(cfg.eval_probes))
        if unknown:
            bad(f"{name} names probes {unknown} that are not in eval_probes {cfg.eval_probes}")
    for probe, t in cfg.eval_temperature.items():
        if isinstance(t, bool) or not isinstance(t, (int, float)) or t < 0:
            bad(f"eval_temperature[{probe!r}]={t!r}: must be a number >= 0 (0 is greedy)")
    for probe, n in cfg.eval_n_samples.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            bad(f"eval_n_samples[{probe!r}]={n!r}: must be an integer >= 1")
    if cfg.reward_mode != "exact" and not _task_takes(cfg.task, "reward_mode"):
        bad(f"reward_mode='{cfg.reward_mode}': task '{cfg.task}' does not take a reward_mode "
            "(the math tasks do: arithmetic, gsm8k, prepared)")
    if cfg.task_args.get("reward_mode", cfg.reward_mode) != cfg.reward_mode:
        bad(f"task_args reward_mode={cfg.task_args['reward_mode']!r} disagrees with reward_mode="
            f"{cfg.reward_mode!r}; set the reward_mode field only")


def _validate_scale(cfg: RunConfig, bad) -> None:
    """The accelerator, rank and rollout-engine settings; backend and engine names from their registries, and
    each one's own rules (Backend.check_config, EngineKind.check_config): no backend or engine is named here."""
    if cfg.backend not in BACKENDS:
        bad(f"backend='{cfg.backend}': choose {', '.join(BACKENDS.names())}")
    for problem in backend_rules(cfg.backend, BackendInputs.of(cfg.section, train_prompts=cfg.train_prompts)):
        bad(problem)
    if cfg.rollout_engine not in ENGINES:
        bad(f"rollout_engine='{cfg.rollout_engine}': choose {', '.join(ENGINES.names())}")
    if cfg.env not in ENVS:
        bad(f"env='{cfg.env}': choose {', '.join(ENVS.names())} (rftlib.envs), or register one with ENVS.register")
    elif (cfg.env != "single_turn" and cfg.rollout_engine in ENGINES
          and not engine_kind(cfg.rollout_engine).continues_from_ids):
        able = [n for n in ENGINES.names() if engine_kind(n).continues_from_ids]
        bad(f"env='{cfg.env}' (a multi-turn rollout) needs an engine that continues from token ids: "
            f"rollout_engine {', '.join(able)}; "
            f"got rollout_engine='{cfg.rollout_engine}'")
    if cfg.max_episode_seconds is not None and cfg.max_episode_seconds <= 0:
        bad(f"max_episode_seconds={cfg.max_episode_seconds} must be positive (None: no clock)")
    if cfg.env != "single_turn":
        sampled = sorted(p for p in cfg.eval_probes
                         if cfg.eval_n_samples.get(p, 1) > 1 or cfg.eval_temperature.get(p, 0.0) > 0)
        if sampled:
            bad(f"eval_n_samples / eval_temperature of probe(s) {sampled} with env='{cfg.env}': evals through an "
                "environment are greedy for now (issue 40); set eval_n_samples 1 and eval_temperature 0 for them")
        if cfg.filter_void_turns and cfg.dynamic_sampling != "off":
            bad(f"filter_void_turns with dynamic_sampling='{cfg.dynamic_sampling}': dynamic sampling keeps groups by "
                "all their rewards, void rows included, and the filter drops rows after it, so a kept group can "
                "leave no signal; use one of the two")
        if cfg.env == "code_feedback" and int(cfg.env_args.get("max_attempts", 3)) > cfg.max_turns:
            bad(f"env code_feedback's max_attempts {cfg.env_args.get('max_attempts', 3)} > max_turns {cfg.max_turns}: "
                "an attempt after max_turns is never scored (its episode would end with return 0); raise "
                "max_turns or lower max_attempts")
    if cfg.filter_void_turns and cfg.env == "single_turn":
        bad("filter_void_turns drops multi-turn trajectories with a void turn; env='single_turn' has no turns to "
            "judge (set env, e.g. calculator, or leave filter_void_turns false)")
    if cfg.max_trajectory_tokens is not None and cfg.max_trajectory_tokens < 1:
        bad(f"max_trajectory_tokens={cfg.max_trajectory_tokens} must be at least 1 (None: max_new_tokens)")
    for problem in engine_kind(cfg.rollout_engine).check_config(EngineInputs.of(cfg.section)):
        bad(problem)
    if cfg.max_staleness > 0 and cfg.rollout_engine in ENGINES:  # asynchronous rollouts (rftlib.train.pipeline)
        why = engine_kind(cfg.rollout_engine).overlap_problem(EngineInputs.of(cfg.section))
        if why:
            bad(f"max_staleness={cfg.max_staleness} with rollout_engine '{cfg.rollout_engine}': {why}; or set "
                "max_staleness 0 (synchronous)")
        if cfg.dynamic_sampling == "refill":
            bad(f"max_staleness={cfg.max_staleness} with dynamic_sampling refill: refill draws extra prompts in the "
                "middle of a step, while an asynchronous producer draws prompts only when a batch is permitted; "
                "use dynamic_sampling mask (the constant groups are masked out of the loss) or max_staleness 0")
    if cfg.vllm_dtype == "float16" and cfg.device == "cpu":
        bad("vllm_dtype='float16' with device='cpu': vLLM's CPU build serves float32 or bfloat16")


def _validate_algo(cfg: RunConfig, bad) -> None:
    """The algorithm variants: reward scaling, the policy loss's own settings, dynamic sampling, overlong,
    KL placement."""
    if cfg.scale_rewards is not None:
        if cfg.scale_rewards not in REWARD_SCALES:
            bad(f"scale_rewards='{cfg.scale_rewards}': valid values are {', '.join(REWARD_SCALES.names())} (or null)")
        if cfg.advantage_estimator in ADVANTAGES and not takes_scale_rewards(cfg.advantage_estimator):
            bad(f"scale_rewards='{cfg.scale_rewards}' with advantage_estimator '{cfg.advantage_estimator}', which has "
                "its own scaling: scale_rewards applies to grpo and dr_grpo; set it null")
    agg = _validate_policy_loss(cfg, bad)
    if (cfg.dynamic_sampling == "mask" and agg.startswith("seq-mean") and cfg.loss_seq_norm == "all"
            and not cfg.kl_in_loss and cfg.entropy_coef == 0):
        bad(f"dynamic_sampling: mask with loss_agg_mode {agg} and loss_seq_norm all changes no gradient: the masked "
            "groups have zero advantage, so zero policy loss, and still count in the normaliser; set loss_seq_norm "
            "nonempty (verl: divide by the rows left in the loss), or dynamic_sampling off")
    if not 0 <= cfg.overlong_buffer_len <= cfg.max_new_tokens:
        bad(f"overlong_buffer_len={cfg.overlong_buffer_len}: must be in [0, max_new_tokens={cfg.max_new_tokens}] "
            "(0 disables the soft overlong penalty; DAPO: 4096 of 20480)")
    if cfg.kl_in_reward:
        if cfg.beta <= 0:
            bad("kl_in_reward: true with beta 0 subtracts nothing: set beta > 0 (e.g. 0.001, DeepSeek-R1's) "
                "or kl_in_reward false")
        if cfg.kl_estimator not in ("k1", "k3"):
            bad(f"kl_in_reward with kl_estimator '{cfg.kl_estimator}': in the reward nothing is differentiated, so "
                "only the value counts; use k1 (verl/OpenRLHF default) or k3")
    elif cfg.beta > 0 and cfg.kl_estimator in KL_NOT_IN_LOSS:
        bad(f"kl_estimator='{cfg.kl_estimator}' with beta={cfg.beta} in the loss: {KL_NOT_IN_LOSS[cfg.kl_estimator]}")


def _validate_policy_loss(cfg: RunConfig, bad) -> str:
    """What the registered losses declare (rftlib.algo.loss_spec): the settings in loss_args belong to
    cfg.policy_loss; each loss's settings class checks its values (every loss's, in use or not: a bad value
    is wrong either way; its ranges and rules, Section.check); and for cfg.policy_loss its dual clip and its
    aggregations. Returns the aggregation the loss will run."""
    owners = loss_settings_owners()
    for key in cfg.loss_args:
        if key in config_fields():
            bad(f"loss_args holds '{key}', a RunConfig field: set {key} itself")
        if key not in owners:
            raise _unknown(key, "loss_args")
        if cfg.policy_loss not in owners[key]:
            losses = " or ".join(f"'{n}'" for n in owners[key])
            bad(f"{key} is a setting of policy_loss {losses}; with policy_loss '{cfg.policy_loss}' it would change "
                f"nothing: set policy_loss {owners[key][0]}, or leave {key} out")
    checked: set[type] = set()
    for name in POLICY_LOSSES.names():
        settings = loss_spec(name).settings
        if settings not in checked:
            checked.add(settings)
            for msg in cfg.section(settings).check():
                bad(msg)
    spec = loss_spec(cfg.policy_loss)
    if cfg.dual_clip is not None and not spec.dual_clip:
        bad(f"dual_clip={cfg.dual_clip} with policy_loss {cfg.policy_loss}: dual clip is a token-level PPO device "
            "this loss does not take; set dual_clip null")
    try:
        return spec.aggregation(cfg.loss_agg_mode)
    except ValueError as e:
        raise ConfigError(f"loss_agg_mode='{cfg.loss_agg_mode}' with policy_loss {cfg.policy_loss}: {e}") from None


def to_dict(cfg: RunConfig) -> dict[str, Any]:
    """The config as {field: value}, flat: loss_args is written as its settings (``toy_clip: 0.3``), and a
    registered policy loss's own settings that are not RunConfig fields with their values (defaults too), so
    config.yaml says what ran and make_config reads it back. Without such a loss: RunConfig's fields alone."""
    d = dataclasses.asdict(cfg)
    args = d.pop("loss_args")
    if cfg.policy_loss in POLICY_LOSSES:
        own = dataclasses.asdict(cfg.section(loss_spec(cfg.policy_loss).settings))
        d.update({k: v for k, v in own.items() if k not in d})
    d.update(args)
    return d


def diff(a: RunConfig | dict, b: RunConfig | dict) -> dict[str, tuple[Any, Any]]:
    """Fields whose values differ: {name: (a, b)}."""
    da = a if isinstance(a, dict) else to_dict(a)
    db = b if isinstance(b, dict) else to_dict(b)
    return {k: (da.get(k), db.get(k)) for k in sorted(set(da) | set(db)) if da.get(k) != db.get(k)}


def schedule_table(presets: list[str] | None = None) -> str:
    """Each preset's derived schedule (rollouts, optimizer steps, warmup, LR at optimizer step 20)."""
    names = presets or sorted(p.stem for p in PARAMS_DIR.glob("seed*.yaml"))
    head = f"{'preset':34} {'rollouts':>9} {'opt/roll':>8} {'opt steps':>10} {'warmup':>7} {'lr':>8} {'lr@20':>10} {'of lr':>7}"
    rows = [head, "-" * len(head)]
    for name in names:
        s = schedule(make_config(name))
        at = s["lr_at_20"]
        rows.append(f"{name:34} {s['rollouts']:>9,} {s['optimizer_steps_per_rollout']:>8} {s['optimizer_steps']:>10,} "
                    f"{s['warmup_steps']:>7,} {s['lr']:>8.2g} " + (f"{at:>10.4g} {at / s['lr']:>7.2%}" if at is not None
                                                                 else f"{'(run < 21 steps)':>18}"))
    return "\n".join(rows)

