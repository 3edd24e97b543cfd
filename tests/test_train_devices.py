"""Every tensor of the update on the trainer's device.

On this CPU-only machine a real CUDA run is impossible, so the update's tensor path (the chunked
LM head, the policy loss with KL and entropy, every aggregation, the advantages) runs on the
``meta`` device (shapes and dtypes, no data): a tensor created on the host inside that path meets
the meta ones and torch raises "not on the expected device". (torch's FakeTensorMode with fake
CUDA tensors was tried first: it aborts the process inside reshape on CPU-only builds.)
The trainer-level audit records the device of every op of a real step; on a GPU machine it is the
real check (every op on cuda), on CPU it checks the plumbing (rollout, loss, metrics) ends on the
trainer's device.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rftlib.algo.advantages import ADVANTAGES, compute_advantages
from rftlib.algo.aggregation import AGGREGATIONS
from rftlib.algo.kl import KL_ESTIMATORS
from rftlib.algo.logprobs import chunked_logprobs_entropy
from rftlib.algo.losses import POLICY_LOSSES, grpo_loss


class _Head(torch.nn.Module):
    def __init__(self, w):
        super().__init__()
        self.weight = torch.nn.Parameter(w)

    def forward(self, h):  # (C, H) -> (C, V)
        return h @ self.weight.T


def _fake_cuda_update(agg: str, kl: str, policy_loss: str, host_leak: bool = False):
    if True:
        dev = torch.device("meta")
        N, T, H, V, G = 4, 6, 8, 11, 2
        head = _Head(torch.empty(V, H, device=dev))  # the LM head as a module, weight (V, H)
        hidden = torch.empty(N, T, H, device=dev, requires_grad=True)  # (N, T, H)
        targets = torch.zeros(N, T, dtype=torch.long, device=dev)  # (N, T)
        mask = torch.ones(N, T, device=dev)  # (N, T)
        if host_leak:  # what the test must catch: a tensor made on the host in the device path
            mask = mask * torch.ones(N, T)
        logp, ent = chunked_logprobs_entropy(hidden, None, targets, head=head, chunk_size=5, entropy_grad=True)  # (N, T)
        rewards = torch.empty(N, device=dev)  # (N,)
        adv = compute_advantages("grpo", rewards, G, 1e-6)  # (N,)
        loss, metrics = grpo_loss(logp, logp.detach(), adv, mask, ref_logprobs=logp.detach(), beta=0.1,
                                  kl_estimator=kl, policy_loss=policy_loss, aggregation=agg, num_seqs=float(N),
                                  num_tokens=mask.sum(), norm_const=float(T), clip_low=0.2, clip_high=0.28,
                                  dual_clip=3.0 if policy_loss == "ppo_clip" else None, log_ratio_clamp=20.0, entropy=ent, entropy_coef=0.01)
        loss.backward()
        return loss, metrics, hidden.grad


@pytest.mark.parametrize("agg", AGGREGATIONS.names())
def test_update_math_stays_on_the_device(agg):
    for kl in KL_ESTIMATORS.names():
        for pl in POLICY_LOSSES.names():
            try:
                loss, metrics, grad = _fake_cuda_update(agg, kl, pl)
            except ValueError as e:  # a combination the config refuses (e.g. k1 in the loss)
                if "k1" in str(e):
                    continue
                raise
            assert loss.device.type == "meta" and grad.device.type == "meta"
            bad = {k: v.device for k, v in metrics.items() if torch.is_tensor(v) and v.device.type != "meta"}
            assert not bad, (agg, kl, pl, bad)


def test_the_fake_device_check_catches_a_host_tensor():
    with pytest.raises(RuntimeError, match="device"):
        _fake_cuda_update("token-mean", "k3", "ppo_clip", host_leak=True)


def test_advantage_estimators_on_the_device():
    r = torch.empty(8, device="meta")  # (N,) with G = 4
    for name in ADVANTAGES.names():
        assert compute_advantages(name, r, 4, 1e-6).device.type == "meta", name


class DeviceAudit(TorchDispatchMode):
    """Records the devices of every op's tensor inputs and outputs."""

    def __init__(self):
        super().__init__()
        self.mixed: list[str] = []
        self.devices: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        flat = [a for a in torch.utils._pytree.tree_leaves((args, kwargs, out)) if isinstance(a, torch.Tensor)]
        devs = {t.device.type for t in flat if t.dim() > 0}  # 0-dim host scalars are allowed by torch
        self.devices |= devs
        if len(devs) > 1:
            self.mixed.append(f"{func}: {sorted(devs)}")
        return out


def test_a_trainer_step_runs_on_its_device(tiny_cfg, task_with):
    from rftlib.train.loop import Trainer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = tiny_cfg(device=device, num_steps=1)
    tr = Trainer(cfg, progress=False, task=task_with(cfg, lambda t, e, tr_: (float(len(t) % 2), {"correctness": 0.0})))
    audit = DeviceAudit()
    with audit:
        row = tr.step()
    tr.close()
    assert not audit.mixed, audit.mixed[:5]
    assert device in audit.devices
    assert row["grad_norm"] > 0  # the step trained
    assert next(tr.model.parameters()).device.type == device
    if device == "cuda":
        assert row["memory/cuda_peak_gib"] > 0
