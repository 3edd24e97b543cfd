"""A recorded step as the inspector shows it (issue 33): the pieces are the completion's text, each token's
gradient weight under the recorded configuration is the closed form of GRPO's loss on an on-policy step, and the
per-token KL and TIS weight columns are there when the step had them."""

import pytest

from rftlib.models.loading import load_tokenizer
from rftlib.monitor import records
from rftlib.report.inspect import render_page
from rftlib.report.record_view import build_view, token_pieces
from rftlib.train.loop import Trainer
from toy_rewards import isdigit_share


@pytest.fixture(scope="module")
def attempt(tmp_path_factory, task_with):
    from rftlib.config import make_config
    cfg = make_config("tiny", {"runs_root": str(tmp_path_factory.mktemp("view") / "runs"), "num_steps": 2,
                               "record_batches": [2], "lr": 3e-2, "warmup_ratio": 0.0, "beta": 0.05,
                               "autocast": "none"})
    tr = Trainer(cfg, progress=False, task=task_with(cfg, isdigit_share))
    tr.train()
    tr.close()
    return tr.run_dir, cfg


@pytest.mark.parametrize("model", ["tiny", "smollm2-135m"])
def test_pieces_join_to_the_text(attempt, model):
    """Byte-level BPE splits a character over tokens ("日" is 3 bytes): each character goes to the token that
    completes it, so the pieces join to the decoded text, multi-byte characters and undecodable bytes included."""
    run, cfg = attempt
    tok = load_tokenizer(model)
    text = "So 9 + 1 = 10.\n\tCafé costs 3€ — 日本語 ok 🙂 done"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    pieces = token_pieces(tok, ids, readable=False)
    assert len(pieces) == len(ids) and "".join(pieces) == tok.decode(ids) == text
    assert "日本語" in "".join(token_pieces(tok, ids))  # readable pieces: no U+FFFD markers for split characters
    if model == "tiny":  # the tiny model's sampled completions: random byte tokens, some never completing
        t = records.read_record(run, 2).rank(0)
        for i in range(t["completion_ids"].shape[0]):
            ids = t["completion_ids"][i, :int(t["completion_mask"][i].sum())].tolist()
            assert "".join(token_pieces(tok, ids, readable=False)) == tok.decode(ids, skip_special_tokens=False)


def test_gradient_weights_are_grpo_closed_form_on_policy(attempt):
    """One optimizer step, the HF engine: every ratio is 1 and GRPO's seq-mean-token-mean gives
    c_t = -A_i / (|y_i| n_seq) + the KL term's; the policy part is checked through beta 0's counterfactual-free
    identity: sum_t c_t over a row = -A_i / n_seq + beta x (the row's KL slope), so rows of zero KL slope... here we
    check the view against a recomputation with beta 0 directly: the KL part is c - c(beta=0)."""
    run, cfg = attempt
    rec = records.read_record(run, 2)
    view = build_view(run, 2, use_latest_replay=False)
    m = rec.manifest
    n_seq = m["opt_steps"][0]["num_seqs"]
    assert m["on_policy"] and len(m["opt_steps"]) == 1
    t = rec.rank(0)
    rows = {r["row"]: r for g in view["groups"] for r in g["rows"]}
    checked = 0
    for i, r in rows.items():
        if r["skipped"] or r["advantage"] == 0:
            continue
        L = int(t["loss_mask"][i].sum())
        # the KL term's weight on token t: beta x d(k)/dlogp / (|y_i| n_seq); with the k3 estimator
        # k = exp(ref - logp) - (ref - logp) - 1, dk/dlogp = 1 - exp(ref - logp)
        import math
        lp, ref = t["trainer_logprobs"][0, i], t["ref_logprobs"][i]
        for k in range(L):
            want = (-r["advantage"] + cfg.beta * (1 - math.exp(float(ref[k] - lp[k])))) / (L * n_seq)
            assert r["values"]["c/recorded"][k] == pytest.approx(want, rel=1e-4, abs=1e-9)
            checked += 1
    assert checked > 0
    assert "kl" in view["quantities"] and "isw" in view["quantities"]
    assert all(v == 1.0 for r in rows.values() for v in r["values"]["isw/recorded"])  # HF engine: no TIS
    html = render_page(view)
    assert "Content-Security-Policy" in html
