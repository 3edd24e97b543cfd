"""``single`` (one process) and ``ddp`` (torch DistributedDataParallel under torchrun) backends.

Both run torch's AdamW and the LR schedule of rftlib.backends.scheduler. Under DDP every rank holds the
whole model and optimizer; gradients are all-reduced (averaged) on the last micro-step of each
optimizer batch only (``no_sync`` before it, as nanoGPT does), so a rank's optimizer state equals
every other rank's and rank 0's copy is the checkpoint.

Mixed precision keeps float32 master weights: whatever ``dtype`` the model was loaded in, every
*trainable* parameter is cast to float32 here, before the optimizer is built, and forward passes run
under autocast in the half dtype (``compute_dtype``). AdamW on bf16 parameters in place would lose
every update below bf16's resolution (~0.4% of the weight: a 1e-6 step on a 0.02 weight rounds to
nothing), so a full fine-tune at seed 000's learning rates would barely move while its loss looked
plausible; and a GradScaler refuses to unscale float16 gradients, so float16 full fine-tuning crashed at
its first step. Frozen parameters (the base model under LoRA, a reference copy) stay in the load dtype,
so LoRA keeps its memory saving; full fine-tuning holds float32 weights as HF Trainer's mixed precision
does. float16 trains with a GradScaler on the model's device (the config refuses float16 on CPU for speed,
not correctness). DeepSpeed keeps its own float32 masters (rftlib.backends.deepspeed).
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from rftlib.models.forward import PolicyForward
from rftlib.models.loading import load_trainable_state
from rftlib.backends import Backend, BackendInputs
from rftlib.backends.scheduler import make_scheduler


def keep_float32_masters(params: list[torch.nn.Parameter]) -> None:
    """Cast each trainable parameter to float32 in place (``.data``, so the module keeps the same Parameter
    objects and peft/DDP references stay valid); float32 ones are left as they are."""
    for p in params:
        if p.dtype != torch.float32:
            p.data = p.data.float()


class TorchBackend(Backend):
    name = "single"
    single_process = True  # several ranks need DDP's gradient all-reduce: backend ddp
    fixed_micro_steps = False  # the optimizer steps when the loop says so: micro-batches may be skipped
    micro_step_grads = True  # p.grad holds the accumulated gradient after each micro-step (the GNS probe reads it)
    partitions_params = False  # every rank holds whole weights

    def __init__(self, inputs: BackendInputs, dist, model, *, total_opt_steps: int, warmup_steps: int):
        self.inputs, self.dist, self.model = inputs, dist, model
        optim = inputs.optim
        self.policy = PolicyForward(model)
        self.params = [p for p in model.parameters() if p.requires_grad]
        keep_float32_masters(self.params)
        self.optimizer = torch.optim.AdamW(self.params, lr=optim.lr, betas=(optim.adam_beta1, optim.adam_beta2),
                                           weight_decay=optim.weight_decay)
        self.scheduler = make_scheduler(self.optimizer, total_steps=total_opt_steps, warmup_steps=warmup_steps,
                                        min_lr_ratio=optim.min_lr_ratio)
        # float16's narrow range needs loss scaling; the scaler unscales the float32 masters' gradients
        self.scaler = torch.amp.GradScaler(dist.device.type) if inputs.model.dtype == "float16" else None
        self.module = self._wrap(self.policy)

    def _wrap(self, policy):
        return policy

    # ---- the six calls the loop makes -----------------------------------------------------------
    def forward(self, **rows):
        return self.module(**rows)

    def accumulate(self, last: bool):
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(self, loss_finite: bool) -> tuple[float, bool]:
        """Clip and step; returns (grad_norm before clipping, whether the optimizer stepped).

        A non-finite loss or grad norm skips the optimizer step (weights unchanged) but the LR
        schedule still advances, so the run keeps the schedule it was planned with.
        """
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.inputs.optim.max_grad_norm))
        stepped = loss_finite and math.isfinite(grad_norm)
        if self.scaler is not None:  # the scaler skips an overflowing step itself and lowers its scale
            if loss_finite:
                self.scaler.step(self.optimizer)
            self.scaler.update()
        elif stepped:
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm, stepped

    def generation_gather(self):
        """(None, ""): every rank holds whole weights, HF generate needs nothing gathered (DeepSpeed's ZeRO-3 does)."""
        return None, ""

    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def train(self, mode: bool = True) -> None:
        self.model.train(mode)

    # ---- checkpoints --------------------------------------------------------------------------
    def trainable_state(self) -> dict[str, torch.Tensor]:
        """Full trainable tensors on the host (the adapter under LoRA)."""
        return {n: p.detach().to("cpu", copy=True) for n, p in self.model.named_parameters() if p.requires_grad}

    def load_trainable(self, state: dict[str, torch.Tensor]) -> None:
        """The trainable tensors alone, whole on every rank (rft replay from a record's snapshot)."""
        load_trainable_state(self.model, state)

    def save(self, tmp: Path) -> None:
        """Every rank's optimizer equals rank 0's under DDP: rank 0 writes the one copy."""
        if not self.dist.is_main:
            return
        torch.save(self.trainable_state(), tmp / "trainable.pt")
        torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(self.scheduler.state_dict(), tmp / "scheduler.pt")
        if self.scaler is not None:
            torch.save(self.scaler.state_dict(), tmp / "grad_scaler.pt")

    def load(self, d: Path) -> None:
        load_trainable_state(self.model, torch.load(d / "trainable.pt", weights_only=True,
                                                    map_location=self.dist.device))
        self.optimizer.load_state_dict(torch.load(d / "optimizer.pt", weights_only=False,
                                                  map_location=self.dist.device))
        self.scheduler.load_state_dict(torch.load(d / "scheduler.pt", weights_only=False))
        if self.scaler is not None and (d / "grad_scaler.pt").exists():
            self.scaler.load_state_dict(torch.load(d / "grad_scaler.pt", weights_only=False))

    def adapter_state(self) -> dict[str, torch.Tensor] | None:
        return None  # the peft model's own save_pretrained sees the real tensors

    def close(self) -> None:
        pass


class DDPBackend(TorchBackend):
    name = "ddp"
    single_process = False

    def _wrap(self, policy):
        if not self.dist.distributed:
            return policy  # one rank: DDP would only add hooks
        dev = self.dist.device
        return DDP(policy, device_ids=[dev.index] if dev.type == "cuda" else None)

    def accumulate(self, last: bool):
        """Skip the gradient all-reduce on every micro-step but the optimizer batch's last."""
        if last or not self.dist.distributed:
            return contextlib.nullcontext()
        return self.module.no_sync()


