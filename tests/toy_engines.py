"""A rollout engine off the trainer's module, without vLLM: what the pipeline tests (issue 32) drive.

``CopyEngine`` samples with HF generate on a frozen *copy* of the policy, one copy per synced version, like a
vLLM server keeps one LoRA adapter per version: a batch bound to version v keeps sampling v while the trainer
updates and publishes v+1. It declares ``shares_trainer_module = False``, so the trainer computes the old
(proximal) logprobs itself and applies the TIS weights, as with vLLM; the copy's numerics equal the trainer's,
so the behaviour/proximal gap is exactly the policy lag. ``delay_s`` sleeps inside each generate (the time an
engine on other GPUs would take), so a test can see generation overlap the update.
Adapters are named ``v<sync count>`` and follow the hold/release contract of rftlib.rollout.vllm: a version
is dropped once it is neither the newest nor held. Like the vLLM engines it keeps the sync probe's recent noise
measurements (``probe_noises``, which a checkpoint saves): here a made-up one per sync, 0.001 x the sync count,
so a test can tell which syncs a window holds. ``closed`` says whether ``close`` ran.

Register it in a test with :func:`register_copy_engine` (monkeypatch restores the registry after the test).
"""

from __future__ import annotations

import copy
import os
import random
import threading
import time
from collections import deque
from pathlib import Path

import torch

from rftlib.rollout.factory import ENGINES, register_engine
from rftlib.rollout.hf import HFEngine


class CopyEngine:
    shares_trainer_module = False
    shared_across_ranks = False

    def __init__(self, model, tok, *, seed: int = 0, delay_s: float = 0.0, control_dir: Path | None = None):
        self.tok = tok
        self.delay_s = delay_s
        self.rng = random.Random(seed)  # base seeds, drawn as rftlib.rollout.vllm draws them
        self.copies: dict[str, torch.nn.Module] = {}
        self.held: dict[str, int] = {}
        self.lock = threading.Lock()
        self.adapter: str | None = None
        self.sync_count = 0
        self.generated: list[tuple[str, int, bool]] = []  # (adapter, rows, greedy) per generate call
        self.control_dir = control_dir  # a file control/inflight_<n> per generate call: a test can wait for it
        self._calls = 0
        self._hf = HFEngine(model, tok)  # precision and use_precision of the eval
        self.probe_noises: deque[float] = deque(maxlen=16)
        self.closed = False

    @property
    def precision(self) -> str:
        return self._hf.precision

    def use_precision(self, name: str):
        return self._hf.use_precision(name)

    # ---- the hold/release contract of rftlib.rollout.vllm ----------------------------------------------
    def hold(self, name: str) -> None:
        with self.lock:
            self.held[name] = self.held.get(name, 0) + 1

    def release(self, name: str) -> None:
        with self.lock:
            self.held[name] -= 1
            if self.held[name] == 0:
                del self.held[name]
            self._drop_unused()

    def _drop_unused(self) -> None:
        for name in list(self.copies):
            if name != self.adapter and name not in self.held:
                del self.copies[name]

    def sync_weights(self, model, adapter_state=None, *, push: bool = True, barrier=None, verify: bool = False) -> dict:
        t = time.time()
        frozen = copy.deepcopy(model)
        frozen.requires_grad_(False)
        frozen.eval()
        with self.lock:
            self.sync_count += 1
            name = f"v{self.sync_count}"
            self.copies[name] = frozen
            self.adapter = name
            self._drop_unused()
        noise = 0.001 * self.sync_count  # made up: which sync measured it
        self.probe_noises.append(noise)
        return {"seconds": time.time() - t, "bytes": 0, "probe_max_diff": 0.0, "probe_baseline": 0.0,
                "probe_threshold": 0.0, "probe_noise": noise}

    def generate(self, prompts, *, group_size: int, max_new_tokens: int, temperature: float, top_p: float = 1.0,
                 greedy: bool = False, seed: int | None = None, adapter: str | None = None):
        model, name = self._begin(adapter, greedy)
        if seed is None:
            seed = self.rng.randrange(2**40)
        out = HFEngine(model, self.tok).generate(prompts, group_size=group_size, max_new_tokens=max_new_tokens,
                                                 temperature=temperature, top_p=top_p, greedy=greedy)
        with self.lock:
            self.generated.append((name, out.num_rows, greedy))
        return out

    @property
    def stop_ids(self) -> tuple[int, ...]:
        return self._hf.stop_ids

    def generate_ids(self, contexts, *, max_new_tokens: list[int], temperature: float, top_p: float = 1.0,
                     greedy: bool = False, seed: int | None = None, adapter: str | None = None):
        """One turn of multi-turn episodes (rftlib.rollout.multi_turn) on the copy of version ``adapter``: HF
        generate_ids on that copy, with the same in-flight marker and delay as :meth:`generate` (a marker per
        turn: a test can wait for a batch's second turn, mid-episode)."""
        model, name = self._begin(adapter, greedy)
        out = HFEngine(model, self.tok).generate_ids(contexts, max_new_tokens=max_new_tokens,
                                                     temperature=temperature, top_p=top_p, greedy=greedy)
        with self.lock:
            self.generated.append((name, len(out), greedy))
        return out

    def _begin(self, adapter: str | None, greedy: bool):
        """The copy a call samples from and its version's name, after the call's in-flight marker and delay
        (sampled calls only)."""
        with self.lock:
            name = adapter or self.adapter
            model = self.copies[name]  # KeyError: a version released while a batch still wanted it (a bug)
            self._calls += 1
            call = self._calls
        if self.control_dir is not None and not greedy:
            self.control_dir.mkdir(parents=True, exist_ok=True)
            (self.control_dir / f"inflight_{call}").write_text(name)
        if self.delay_s and not greedy:
            time.sleep(self.delay_s)
        return model, name

    def close(self) -> None:
        self.copies.clear()
        self.closed = True


made: list[CopyEngine] = []  # every CopyEngine the registered factory built, in order (a test reads the last)


def register_copy_engine(monkeypatch=None, *, delay_s: float | None = None) -> None:
    """Register ``rollout_engine: copy`` (monkeypatch given: restored after the test). The delay comes from
    ``delay_s`` or RFT_TOY_GEN_DELAY (seconds, for a subprocess worker); RFT_TOY_CONTROL names a directory for
    the in-flight marker files. Each engine built is appended to :data:`made`."""
    if monkeypatch is not None:
        monkeypatch.setattr(ENGINES, "_table", dict(ENGINES._table))
    delay = float(os.environ.get("RFT_TOY_GEN_DELAY", "0")) if delay_s is None else delay_s
    control = os.environ.get("RFT_TOY_CONTROL")

    @register_engine("copy", on_trainer_module=False, continues_from_ids=True)
    def _copy(inputs, model, tok, run_dir, backend):
        made.append(CopyEngine(model, tok, seed=inputs.attempt.seed, delay_s=delay,
                               control_dir=Path(control) if control else None))
        return made[-1]
