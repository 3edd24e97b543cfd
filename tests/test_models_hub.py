"""Hub model ids in presets (Qwen/Qwen2.5-1.5B-Instruct, openai/gpt-oss-20b, ...) load the way
transformers loads them: from the local Hugging Face cache, or the hub when online; offline and not
cached, a clear error. No network here: the cache is a fake one made in the test, holding the
tiny model under a hub id."""

from __future__ import annotations

import shutil

import pytest

from rftlib.models.loading import load_model_and_tokenizer, resolve_model_path

HUB_ID = "Qwen/Qwen2.5-1.5B-Instruct"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def fake_hf_cache(tmp_path, monkeypatch):
    """An HF hub cache laid out as huggingface_hub writes it: models--Qwen--Qwen2.5-1.5B-Instruct/
    refs/main (the commit) and snapshots/<commit>/ (the files), holding the tiny model's files."""
    from rftlib.models.tiny import tiny_model_dir

    repo = tmp_path / "hub" / "models--Qwen--Qwen2.5-1.5B-Instruct"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    shutil.copytree(tiny_model_dir(), repo / "snapshots" / COMMIT)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no network here: never try the hub
    return repo / "snapshots" / COMMIT


def test_cached_hub_id_resolves_to_the_snapshot_and_loads(fake_hf_cache):
    from rftlib.models.tiny import tiny_model_dir

    assert resolve_model_path(HUB_ID) == fake_hf_cache
    model, tok = load_model_and_tokenizer(HUB_ID)
    tiny, _ = load_model_and_tokenizer(str(tiny_model_dir()))
    import torch

    assert model.config._name_or_path == str(fake_hf_cache)  # read from the cache's snapshot
    a, b = model.state_dict(), tiny.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # the cached weights loaded
    assert tok.padding_side == "left" and tok.pad_token is not None


def test_uncached_hub_id_offline_says_so(fake_hf_cache):
    # before: "model 'openai/gpt-oss-20b' is neither an alias (smollm2-135m, tiny) nor a path that exists"
    with pytest.raises(FileNotFoundError, match=r"'openai/gpt-oss-20b' is a Hugging Face hub id that is not in the "
                                                r"local HF cache .*HF_HUB_OFFLINE is set.*hf download openai/gpt-oss-20b"):
        load_model_and_tokenizer("openai/gpt-oss-20b")


def test_not_an_alias_path_or_hub_id(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither an alias .* nor a Hugging Face hub id"):
        resolve_model_path(str(tmp_path / "no" / "such" / "dir"))
