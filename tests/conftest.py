import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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
