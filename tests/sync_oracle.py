"""Today's synchronous GRPO step (main before issue 32), written from the trainer's public phases: the oracle the
asynchronous pipeline at max_staleness 0 must equal bit for bit (tests/test_train_pipeline.py, and
tests/dist_worker.py --oracle on 2 ranks)."""

from __future__ import annotations

from rftlib.algo.filtering import constant_groups
from rftlib.train import steps


def synchronous_step(tr) -> dict:
    """Today's synchronous GRPO step (main before issue 32), written from the trainer's public phases: rollout
    on this thread, dynamic sampling, advantages, update, sync, the metrics row. The oracle of the k = 0 test."""
    cfg, G = tr.cfg, tr.cfg.n_samples_per_prompt
    drawn = []

    def draw(n):
        drawn.append(tr.rollout(n))
        return drawn[-1]

    first = draw(cfg.rollout_batch_size)
    batch = steps.dynamic_sampling(first, draw, group_size=G, mode=cfg.dynamic_sampling,
                                   max_rounds=cfg.dynamic_sampling_max_rounds)
    tr._move_sampler([it[3] for it in batch.items], [d for it in batch.items for d in it[4]], batch.rewards.tolist())
    adv = tr.advantages(batch)
    upd = tr.update(adv)
    sync = tr.sync()
    tr.step_num += 1
    timing = {"generate": 0.0, "reward": 0.0, "reference": 0.0, "update": 0.0, "sync": 0.0, "step": 0.0}
    extra = {**adv.metrics, **batch.metrics,
             "frac_reward_zero_std": float(constant_groups(first.rewards, G).float().mean())}
    return tr._step_row(adv, upd, sync, timing, extra, [tr.step_num - 1] * adv.rollout.num_rows)
