"""A trainer rank hands its server engines every prompt of a call at once. Two stub vLLM
servers (the OpenAI-compatible routes the engine uses: /health, /v1/completions) record how many sequences
each was given at the same time; vLLM itself is not needed, so this runs anywhere."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import rftlib.rollout.vllm_server as vs
from rftlib.models.tiny import build_tiny_tokenizer
from rftlib.rollout.assemble import encode_prompts
from rftlib.rollout.vllm import VLLMSettings

HOLD_S = 5.0  # a stub request waits this long at most for the rest of its engine's share to arrive


class StubEngine:
    """One fake engine. A completions request counts its sequences (prompts x n) in flight, waits until the
    expected number is in flight (or HOLD_S passes), then answers: one token per completion, whose logprob
    says which prompt (its token count) and which completion (j / 10) it belongs to."""

    def __init__(self, expect: int, token: int):
        self.expect, self.token = expect, token
        self.in_flight = 0
        self.max_in_flight = 0
        self.requests: list[dict] = []  # the bodies, in arrival order
        self.cond = threading.Condition()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _reply(self, obj):
                data = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._reply({})  # /health

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompts = body["prompt"] if isinstance(body["prompt"][0], list) else [body["prompt"]]
                seqs = len(prompts) * body["n"]
                with stub.cond:
                    stub.requests.append(body)
                    stub.in_flight += seqs
                    stub.max_in_flight = max(stub.max_in_flight, stub.in_flight)
                    stub.cond.notify_all()
                    stub.cond.wait_for(lambda: stub.max_in_flight >= stub.expect, timeout=HOLD_S)
                    stub.in_flight -= seqs
                choices = [{"index": p * body["n"] + j, "token_ids": [stub.token],
                            "logprobs": {"token_logprobs": [-(len(ids) + j / 10)]}}
                           for p, ids in enumerate(prompts) for j in range(body["n"])]
                self._reply({"choices": choices})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


TOK = build_tiny_tokenizer()  # left padding, as the engines need
TOKEN = TOK("a", add_special_tokens=False).input_ids[0]  # what every stub completion is: no stop token


def engine_on(stubs, tmp_path, monkeypatch) -> vs.VLLMServerEngine:
    monkeypatch.setattr(vs, "import_vllm", lambda *a: None)  # the stubs stand in for vLLM
    s = VLLMSettings(model_dir="stub", dtype="float32", lora_rank=0, max_model_len=512, kv_cache_gib=0.0,
                     gpu_memory_utilization=0.0, enforce_eager=True, tensor_parallel_size=1,
                     num_engines=len(stubs), sleep_mode=False, probe_tol=0.05, seed=0, on_gpu=False,
                     urls=tuple(st.url for st in stubs))
    return vs.VLLMServerEngine(s, TOK, tmp_path)


PROMPTS = [" ".join(["7"] * (i + 1)) for i in range(12)]  # 12 prompts of distinct lengths


@pytest.mark.parametrize("greedy", [False, True], ids=["sampled", "greedy"])
def test_each_engine_is_given_its_whole_share_at_once(tmp_path, monkeypatch, greedy):
    """12 prompts over 2 engines: each engine's 6 prompts (x G) reach it together. Sampled prompts come as 6
    requests of n=G, each with its own seed (G apart, as _VLLMBase.generate gives them); greedy ones as one
    request of 6 prompts. Before the fix a pool of max(4, 2 x engines) = 4 threads sent one prompt per
    request, so an engine held at most 4 prompts' sequences, whatever the call's size."""
    G = 1 if greedy else 2
    stubs = [StubEngine(expect=6 * G, token=TOKEN) for _ in range(2)]
    eng = engine_on(stubs, tmp_path, monkeypatch)
    try:
        ro = eng.generate(PROMPTS, group_size=G, max_new_tokens=4, temperature=1.0, greedy=greedy, seed=1000)
    finally:
        eng.close()
        for st in stubs:
            st.close()
    assert [st.max_in_flight for st in stubs] == [6 * G, 6 * G]
    sizes = [[len(b["prompt"]) for b in st.requests] for st in stubs]
    if greedy:
        assert sizes == [[6], [6]] and all(b["seed"] is None for st in stubs for b in st.requests)
    else:
        assert sizes == [[1] * 6, [1] * 6]
        seeds = sorted(b["seed"] for st in stubs for b in st.requests)
        assert seeds == [1000 + i * G for i in range(12)]  # prompt i's own seed, G apart
    # rows come back prompt-major in the caller's order: row r is prompt r // G, completion r % G
    lens = [len(ids) for ids in encode_prompts(TOK, PROMPTS)[2]]
    want = [-(lens[r // G] + (r % G) / 10) for r in range(12 * G)]
    got = ro.behaviour_logprobs[:, 0].tolist()
    assert got == pytest.approx(want)


class _SeedRecorder:
    """The trainer's rank r engine object as _VLLMBase builds it, with the placement hook recording what each
    prompt is sent (no server, no vLLM)."""

    def __init__(self, rank: int, seed: int = 7):
        from rftlib.rollout.vllm import _VLLMBase

        s = VLLMSettings(model_dir="stub", dtype="float32", lora_rank=0, max_model_len=512, kv_cache_gib=0.0,
                         gpu_memory_utilization=0.0, enforce_eager=True, tensor_parallel_size=1, num_engines=1,
                         sleep_mode=False, probe_tol=0.05, seed=seed, on_gpu=False, rank=rank)
        sent = self.sent = []

        class Engine(_VLLMBase):
            def _sample(self, prompt_id_lists, params, adapter):
                sent.append([p["seed"] for p in params])
                return [([TOKEN], [-1.0]) for p in params for _ in range(p["n"])]

        self.engine = Engine(s, TOK, "unused")


def test_each_trainer_rank_sends_vllm_its_own_seeds():
    """Ranks share server engines (seed 003: 4 ranks, 2 engines) and each draws its calls' base seeds itself.
    Rank 0 keeps the single-process stream (Random(seed)); rank r starts from seed + 1,000,003 x r, as the HF path
    reseeds torch per rank (rftlib.train.build). Before the fix every rank drew from Random(seed): rank 1's i-th
    prompt sampled vLLM's stream of rank 0's i-th prompt, call after call. The pipeline's next-seed draw (the
    trainer's seed, rftlib.train.pipeline.engine_seed, reads engine.rng) takes the same stream."""
    import random

    G, B, calls = 4, 3, 2
    sent = {}
    for rank in (0, 1):
        rec = _SeedRecorder(rank)
        for _ in range(calls):
            rec.engine.generate(PROMPTS[:B], group_size=G, max_new_tokens=1, temperature=1.0)
        sent[rank] = rec.sent
    for rank, stream_seed in ((0, 7), (1, 7 + 1_000_003)):
        rng = random.Random(stream_seed)  # the draws generate makes: one base per call, prompt i at base + i*G
        want = []
        for _ in range(calls):
            base = rng.randrange(2**40)
            want.append([base + i * G for i in range(B)])
        assert sent[rank] == want, (rank, sent[rank], want)
    flat = {r: {s for call in sent[r] for s in call} for r in sent}
    assert not flat[0] & flat[1]  # no prompt of rank 1 shares a random stream with one of rank 0


def test_the_trainer_rank_reaches_the_engine_settings(monkeypatch):
    """The factory hands VLLMSettings the backend's rank (rftlib.train.build builds the engine with its backend)."""
    import rftlib.rollout.factory as factory

    seen = {}

    def from_config(inputs, model, run_dir, *, rank=0):
        seen["rank"] = rank
        return "settings"

    monkeypatch.setattr(factory.VLLMSettings, "from_config", staticmethod(from_config))
    monkeypatch.setattr(factory, "VLLMEngine", lambda s, tok, run_dir: ("colocated", s))
    inputs = type("I", (), {"engine": type("E", (), {"vllm_placement": "colocate"})()})()
    backend = type("B", (), {"dist": type("D", (), {"rank": 3})()})()
    assert factory.vllm_engine(inputs, None, None, "run", backend) == ("colocated", "settings")
    assert seen["rank"] == 3
    factory.vllm_engine(inputs, None, None, "run", None)  # one process, no backend: rank 0
    assert seen["rank"] == 0


def test_generate_ids_continues_each_context_as_ids_with_its_own_budget_seed_and_adapter():
    """_VLLMBase.generate_ids (a multi-turn turn on vLLM): each context goes to the engine as its ids with one
    completion (n 1), its own max_tokens and seed base + i, under the adapter named (held for the call); a row
    that reached a stop token keeps it and is not truncated, one cut at its budget is, and a greedy call (no
    logprobs asked for) gets zeros."""
    from rftlib.rollout.vllm import _VLLMBase

    s = VLLMSettings(model_dir="stub", dtype="float32", lora_rank=0, max_model_len=512, kv_cache_gib=0.0,
                     gpu_memory_utilization=0.0, enforce_eager=True, tensor_parallel_size=1, num_engines=1,
                     sleep_mode=False, probe_tol=0.05, seed=7, on_gpu=False, rank=0)
    sent = []
    stop = TOK.eos_token_id

    class Engine(_VLLMBase):
        def _sample(self, prompt_id_lists, params, adapter):
            sent.append((prompt_id_lists, params, adapter, dict(self.inflight)))
            rows = [[5, 6, stop, 9], [5, 6, 7, 8, 9]]  # row 0 stops at its third token; row 1 never stops
            return [(rows[i], [] if p["logprobs"] is None else [-0.5] * len(rows[i])) for i, p in enumerate(params)]

    eng = Engine(s, TOK, "unused")
    out = eng.generate_ids([[1, 2, 3], [4]], max_new_tokens=[10, 4], temperature=0.7, seed=100)
    ((ids_sent, params, adapter, held),) = sent
    assert ids_sent == [[1, 2, 3], [4]] and [p["n"] for p in params] == [1, 1]
    assert [p["max_tokens"] for p in params] == [10, 4] and [p["seed"] for p in params] == [100, 101]
    assert adapter == "base" and held == {"base": 1} and eng.inflight.get("base", 0) == 0  # held for the call
    assert out == [([5, 6, stop], [-0.5] * 3, False), ([5, 6, 7, 8], [-0.5] * 4, True)]
    greedy = eng.generate_ids([[1]], max_new_tokens=[3], temperature=1.0, greedy=True)
    assert sent[-1][1][0]["temperature"] == 0.0 and greedy == [([5, 6, stop], [0.0] * 3, False)]


def _lengths(stub) -> list[int]:
    """The lengths of the contexts a stub server was sent (each request's prompt, or prompts)."""
    out = []
    for b in stub.requests:
        out += [len(p) for p in (b["prompt"] if isinstance(b["prompt"][0], list) else [b["prompt"]])]
    return sorted(out)


def test_a_multi_turn_group_reaches_one_server_on_every_turn(tmp_path, monkeypatch):
    """generate_ids with ``route`` (each row's GRPO group, what the multi-turn source passes to an engine that
    ``routes_groups``): over 2 servers, the rows of group g all go to server g % 2, on the first turn (all 6 rows)
    and on a later one where rows 1 and 4 have ended (rows 0, 2, 3, 5 left: without the route, row position 1 of
    that call, group 0's row 2, would go to server 1); the rows come back in the caller's order."""
    stubs = [StubEngine(expect=1, token=TOKEN) for _ in range(2)]
    eng = engine_on(stubs, tmp_path, monkeypatch)
    assert eng.routes_groups
    contexts = [[1] * (r + 1) for r in range(6)]  # row r: r + 1 tokens (the stub's logprob says which row)
    try:
        first = eng.generate_ids(contexts, max_new_tokens=[4] * 6, temperature=1.0, seed=0, route=[0, 0, 0, 1, 1, 1])
        assert _lengths(stubs[0]) == [1, 2, 3] and _lengths(stubs[1]) == [4, 5, 6]  # group 0's rows, group 1's
        for st in stubs:
            st.requests.clear()
        left = [0, 2, 3, 5]
        later = eng.generate_ids([contexts[r] for r in left], max_new_tokens=[4] * 4, temperature=1.0, seed=0,
                                 route=[r // 3 for r in left])
        assert _lengths(stubs[0]) == [1, 3] and _lengths(stubs[1]) == [4, 6]
    finally:
        eng.close()
        for st in stubs:
            st.close()
    assert [lp[0] for _, lp, _ in first] == [-(r + 1) for r in range(6)]
    assert [lp[0] for _, lp, _ in later] == [-(r + 1) for r in left]
