import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Modules whose tests compare floats computed by CPU kernels (gradients, logprobs, losses through the
# model, engine vs trainer): marked `numeric`, which scripts/test_forced_isa.sh runs with other kernels.
# A prefix, so a new test_algo_*.py or test_trainer_*.py is in without a list to update.
NUMERIC_MODULES = ("test_algo_", "test_trainer", "test_distributed", "test_rollout_hf", "test_vllm_")


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
