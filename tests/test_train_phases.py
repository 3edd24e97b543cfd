"""The Trainer's phases are public: rollout -> advantages -> update -> sync, each returning a dataclass
(rftlib.train.phases), observed through ``Trainer.hooks`` and ``Trainer.around`` instead of patched.

``step()`` only orchestrates them: the same phases called by hand on a second trainer built with the
same seed leave the same weights, bit for bit (same arithmetic in the same order).
"""

from contextlib import contextmanager

import pytest
import torch

from rftlib.train.loop import Trainer
from rftlib.train.phases import Advantaged, EvalResult, Forward, Scored, SyncResult, UpdateResult
from toy_rewards import isdigit_share as digit_reward  # varied rewards from the untrained tiny model


def _trainable(tr) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in tr.model.named_parameters() if p.requires_grad}


def test_the_phases_by_hand_make_the_step_and_the_hooks_see_each(tiny_cfg, task_with):
    cfg = tiny_cfg(skip_zero_advantage_rows=False, warmup_ratio=0.0)  # no warmup: the first step has an LR
    seen = []
    a = Trainer(cfg, progress=False, task=task_with(cfg, digit_reward),
                hooks=[lambda phase, seconds, result: seen.append((phase, seconds, result))])
    try:
        before = _trainable(a)
        row = a.step()
        after_step = _trainable(a)
    finally:
        a.close()
    assert [p for p, _, _ in seen if p != "forward"] == ["rollout", "advantages", "update", "sync", "step"]
    res = {p: r for p, _, r in seen}
    assert all(s >= 0 for _, s, _ in seen)
    assert isinstance(res["rollout"], Scored) and isinstance(res["advantages"], Advantaged)
    assert isinstance(res["update"], UpdateResult) and isinstance(res["sync"], SyncResult)
    assert res["step"] is row
    upd, batch = res["update"], res["advantages"]
    # 4 prompts x G 4, one optimizer batch, no row skipped: one optimizer step over the 16 rows
    assert len(upd.loss) == 1 and upd.rows_seen == upd.rows_run == 16 == batch.rollout.num_rows
    assert row["loss"] == upd.loss[0] and row["grad_norm"] == upd.grad_norm[0] == row["grad_norm_max"]
    assert row["update/skipped_row_frac"] == 0.0 and row["reward_mean"] == pytest.approx(sum(batch.rewards) / 16)
    # the forwards with a graph are the update's: micro-batches of 8 over the 16 rows
    grad_rows = [r.rows["completion_ids"].shape[0] for p, _, r in seen if p == "forward" and r.grad]
    assert all(isinstance(r, Forward) for p, _, r in seen if p == "forward") and grad_rows == [8, 8]
    assert any(not torch.equal(before[n], after_step[n]) for n in before), "the step must move the weights"

    b = Trainer(cfg, progress=False, task=task_with(cfg, digit_reward))  # same seed: the same rollout
    try:
        scored = b.rollout(cfg.rollout_batch_size)
        assert torch.equal(scored.rewards, res["rollout"].rewards)
        batch_b = b.advantages(scored)
        assert torch.equal(batch_b.advantages, batch.advantages)
        upd_b = b.update(batch_b)
        b.sync()
        by_hand = _trainable(b)
        ev = b.evaluate()
    finally:
        b.close()
    assert upd_b.loss == upd.loss and upd_b.grad_norm == upd.grad_norm
    assert all(torch.equal(by_hand[n], after_step[n]) for n in by_hand)  # bit for bit
    assert isinstance(ev, EvalResult) and ev.step == 0 and "eval/heldout/greedy_pass@1" in ev.values()
    assert "step" not in ev.values() and ev.metrics["step"] == 0


def test_around_wraps_each_phase_and_the_hooks_follow_it(tiny_cfg):
    events = []

    @contextmanager
    def around(phase):
        events.append(("enter", phase))
        yield
        events.append(("exit", phase))

    tr = Trainer(tiny_cfg(skip_zero_advantage_rows=False), progress=False)  # every row runs a forward
    tr.around.append(around)
    tr.hooks.append(lambda phase, seconds, result: events.append(("hook", phase)))
    try:
        tr.sync()
        tr.update(tr.advantages(tr.rollout(4)))
    finally:
        tr.close()
    top = [e for e in events if e[1] != "forward"]  # the forwards nest inside the update
    assert top == [(k, p) for p in ("sync", "rollout", "advantages", "update") for k in ("enter", "exit", "hook")]
    inside = events[events.index(("enter", "update")):events.index(("exit", "update"))]
    assert ("hook", "forward") in inside  # the update's own forwards, each a phase of its own


def test_a_timed_phase_on_cuda_waits_for_its_kernels(monkeypatch):
    """CUDA launches return before the kernels run, so a phase's clock must stop after torch.cuda.synchronize on
    the trainer's device, or its kernels' time lands in the next phase (the timeline and timing/*). Checked on CPU:
    the synchronize is a stand-in that records when it ran; the per-micro-batch forward is left unsynchronized,
    and a CPU device is never synchronized. Before the fix no phase synchronized."""
    from rftlib.train.phases import phase

    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(("sync", device)))

    class T:
        around, dist = [], type("D", (), {"device": torch.device("cuda", 1)})()
        hooks = [lambda name, seconds, result: calls.append(("hook", name))]

        @phase("update")
        def update(self):
            calls.append(("ran", "update"))

        @phase("forward", synchronize=False)
        def forward(self):
            calls.append(("ran", "forward"))

    T().update()
    T().forward()
    assert calls == [("ran", "update"), ("sync", torch.device("cuda", 1)), ("hook", "update"),
                     ("ran", "forward"), ("hook", "forward")]
    calls.clear()
    cpu = T()
    cpu.dist = type("D", (), {"device": torch.device("cpu")})()
    cpu.update()
    assert calls == [("ran", "update"), ("hook", "update")]
