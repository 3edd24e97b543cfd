import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Modules whose tests compare floats computed by CPU kernels (gradients, logprobs, losses through the
# model, engine vs trainer): marked `numeric`, which scripts/test_forced_isa.sh runs with other kernels.
# Test files are named test_<package>_<topic>.py after the rftlib package they test. Prefixes, so a new
# test_algo_*.py or test_rollout_vllm_*.py is in without a list to update; of train/ the modules that
# compare floats through the model (its checkpoint, device and build tests do not).
NUMERIC_MODULES = ("test_algo_", "test_rollout_hf", "test_rollout_vllm_", "test_eval_precision", "test_train_loop",
                   "test_train_guardrails", "test_train_precision", "test_train_speed",
                   "test_train_variants", "test_train_distributed", "test_train_logprob_batch",
                   "test_train_zero3_gather")


def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.name.startswith(NUMERIC_MODULES):
            item.add_marker(pytest.mark.numeric)


@pytest.fixture(scope="session")
def tiny_dir():
    """The tiny locally built model (cached under .cache/models; built in seconds on first use)."""
    from rftlib.models.tiny import tiny_model_dir

    return tiny_model_dir()


@pytest.fixture
def tiny_cfg(tmp_path):
    """A config on the tiny model that trains in seconds; override fields with .replace()."""
    from rftlib.config import make_config

    def make(**kw):
        return make_config("tiny", {"runs_root": str(tmp_path / "runs"), **kw})

    return make


@pytest.fixture(scope="session")
def task_with():
    """``task_with(cfg, reward)``: the config's own task (RunConfig.task with its task_args and eval_size)
    scored by ``reward``: how a test hands the trainer its reward, ``Trainer(cfg, task=task_with(cfg, fn))``.
    A fresh task on each call (build() drops prompts longer than prompt_max_len from task.train in place),
    so a resumed Trainer gets its own. Session-scoped: a module fixture may use it."""
    from dataclasses import replace

    from rftlib.train.build import build_task

    def make(cfg, reward):
        return replace(build_task(cfg), reward=reward)

    return make


@pytest.fixture(scope="module")
def sb(request):
    """A 2-worker code sandbox pool shared by a test module. A module sets ``SANDBOX_TIMEOUT_S`` for another
    per-job wall clock (default 5 s). A machine without bubblewrap/seccomp fails the test rather than skipping
    it: CI must run the sandbox tests, so the set-up script is named."""
    from rftlib.rewards.sandbox import Sandbox, check_available

    ok, why = check_available()
    if not ok:
        pytest.fail(f"the sandbox is unavailable here ({why}): run `bash scripts/setup_sandbox.sh`")
    with Sandbox(num_workers=2, timeout_s=getattr(request.module, "SANDBOX_TIMEOUT_S", 5.0)) as box:
        yield box
