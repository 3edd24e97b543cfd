"""The trainer: the builder, the GRPO loop, checkpoints, ranks (its backends are rftlib.backends, a layer below).

    build         build(cfg) -> Parts (task, reward, policy, reference, backend, engine, sampler, logger),
                  each from its registry; build_policy is the one place the policy is loaded
    loop          Trainer(cfg, parts=...): rollout -> reward -> advantages -> update -> sync -> log/eval/ckpt
    steps         the step's pieces that are not the loop: loss arguments, reward shaping, dynamic sampling
    step_metrics  one metrics row from every rank's accumulators
    sampler       the seeded, resumable prompt order
    checkpoint    atomic step_N directories, step_latest, RNG state
    dist          ranks, devices, dtypes under torchrun
    torchrun      rft train --nproc: starting the ranks under torchrun
    step_memory   memory per step (RSS, CUDA peak) beside the estimate

How to add a backend: rftlib.backends (its docstring). An engine: rftlib.rollout.factory. A
reward: rftlib.rewards.registry. A loss: rftlib.algo.loss_spec. Each is one module and one
registration; tests/test_train_build.py, tests/test_rewards_registry.py and
tests/test_algo_loss_spec.py register toy ones.
"""
