"""Embeddings and reranking batched: many inputs to a decode, from one request and from
concurrent ones (``worker.embedding``). The packing policy alone; then real llama.cpp on a
random-weight model and on Gemma 3 270M (batched against alone, mixed lengths, an input longer
than the batch, determinism); then the real server under concurrent clients and hostile sizes.

The stated tolerance: a sequence attends only to its own cells, but llama.cpp's kernels sum in
an order, and with flash attention in a precision, that depends on how many tokens share the
micro-batch; so a vector batched and the same input's alone agree to a cosine of ``COSINE``
(without flash attention to ``COSINE_NO_FA``), and a decode of the same inputs twice is the
same bit for bit."""

from __future__ import annotations

import asyncio
import json
import math
import urllib.error
import urllib.request

import pytest
from helpers import ServerProcess, tiny_random_model

from gateway import protocol
from gateway.models import testmodels as tm
from gateway.worker import embedding
from gateway.worker.embedding import Job, pack

COSINE = 0.995  # flash attention (llama.cpp's choice on a CPU): its kernel for a short micro-batch sums in half precision
COSINE_NO_FA = 0.9998


def cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / (math.hypot(*a) * math.hypot(*b))


# --- the packing policy -------------------------------------------------------------------------

def job(*lengths: int, rid: int = 1) -> Job:
    return Job(rid, [[7] * n for n in lengths], False)


def test_pack_takes_one_input_from_each_job_in_turn():
    a, b = job(3, 3, 3, rid=1), job(2, 2, rid=2)
    got = pack([a, b], budget=100, seqs=64)
    assert [(j.rid, i) for j, i in got] == [(1, 0), (2, 0), (1, 1), (2, 1), (1, 2)]


def test_pack_stops_at_the_token_budget_and_the_sequences():
    a = job(*[4] * 10)
    assert [i for _, i in pack([a], budget=12, seqs=64)] == [0, 1, 2]
    assert [i for _, i in pack([a], budget=100, seqs=2)] == [0, 1]


def test_pack_resumes_where_the_last_decode_stopped():
    a = job(4, 4, 4)
    a.taken = 2
    assert [i for _, i in pack([a], budget=100, seqs=64)] == [2]
    a.taken = 3
    assert pack([a], budget=100, seqs=64) == []


def test_an_input_longer_than_the_budget_goes_alone():
    a, b = job(50, 2, rid=1), job(2, rid=2)
    assert [(j.rid, i) for j, i in pack([a, b], budget=10, seqs=64)] == [(1, 0)]
    a.taken = 1  # next: the short ones together
    assert [(j.rid, i) for j, i in pack([a, b], budget=10, seqs=64)] == [(1, 1), (2, 0)]


def test_a_job_whose_next_input_does_not_fit_gives_no_more_but_others_do():
    a, b = job(2, 9, 1, rid=1), job(3, 3, rid=2)
    got = pack([a, b], budget=10, seqs=64)
    # a's 9 does not fit after 2 + 3: a is done for this decode (its 1 is not taken out of order)
    assert [(j.rid, i) for j, i in got] == [(1, 0), (2, 0), (2, 1)]


def test_a_long_input_behind_short_ones_waits_for_its_own_decode():
    a = job(2, 2, 50)
    assert [i for _, i in pack([a], budget=10, seqs=64)] == [0, 1]


# --- real llama.cpp, in this process ----------------------------------------------------------

class Engine:
    """An embedding model's context and embedder in this process."""

    def __init__(self, path, **load):
        from gateway.worker.model import Model
        from gateway.worker.prompts import Prompts

        self.model = Model(protocol.LoadParams(name="e", path=str(path), embeddings=True,
                                               **{"n_ctx": 512, "n_threads": 2, **load}))
        self.prompts = Prompts(self.model)
        self.embedder = embedding.Embedder(self.model)
        self.decodes = 0

    def submit(self, rid: int, inputs: list, query: str | None = None) -> None:
        tokens = embedding.read(self.model, self.prompts, protocol.Embed(rid, inputs, query))
        self.embedder.add(rid, tokens, query is not None)

    def drain(self) -> dict[int, list[list[float]]]:
        out = {}
        while self.embedder.busy:
            self.decodes += 1
            for event in self.embedder.step():
                assert isinstance(event, protocol.Embeddings), event
                out[event.id] = event.data
        return out

    def embed(self, inputs: list, query: str | None = None) -> list[list[float]]:
        self.submit(0, inputs, query)
        return self.drain()[0]

    def close(self) -> None:
        self.embedder.close()


TEXTS = ["hello world", "The quick brown fox jumps over the lazy dog. " * 3, "a", "Embeddings are vectors.",
         "x " * 60, "Ünïcödé 日本語 🙂", "def f(x):\n    return x * 2\n"]


@pytest.fixture(scope="module")
def random_model():
    return tiny_random_model("llama-spm", seed=3)


@pytest.mark.parametrize("flash_attn,tolerance", [(None, COSINE), (False, COSINE_NO_FA)])
def test_batched_agrees_with_alone_and_is_deterministic(random_model, flash_attn, tolerance):
    e = Engine(random_model, flash_attn=flash_attn)
    alone = [e.embed([t])[0] for t in TEXTS]
    e.decodes = 0
    batched = e.embed(TEXTS)
    assert e.decodes == 1  # every input in one decode
    for a, b in zip(alone, batched, strict=True):
        assert cos(a, b) >= tolerance
        assert math.isclose(math.hypot(*b), 1.0, rel_tol=1e-6)  # normalized
    assert e.embed(TEXTS) == batched  # the same decode twice: the same bits
    assert e.embed([TEXTS[0]])[0] == alone[0]
    e.close()


def test_mixed_lengths_and_an_input_longer_than_the_batch(random_model):
    e = Engine(random_model, n_batch=32, flash_attn=False)
    long = "many words in a row " * 30  # far past 32 tokens
    inputs = ["short", long, "also short", "a third", long + " changed", "end"]
    assert len(e.model.vocab.tokenize(long, add_special=True)) > 32
    alone = [e.embed([t])[0] for t in inputs]
    e.decodes = 0
    batched = e.embed(inputs)
    assert e.decodes >= 3  # each long input alone; the short ones together
    assert all(cos(a, b) >= COSINE_NO_FA for a, b in zip(alone, batched, strict=True))
    e.close()


def test_concurrent_requests_share_decodes_and_each_gets_its_own(random_model):
    e = Engine(random_model, flash_attn=False)
    requests = {rid: [f"request {rid} input {i}" for i in range(rid + 1)] for rid in range(1, 6)}
    alone = {rid: e.embed(inputs) for rid, inputs in requests.items()}
    for rid, inputs in requests.items():
        e.submit(rid, inputs)
    e.decodes = 0
    got = e.drain()
    assert e.decodes == 1  # 15 short inputs of five requests: one decode
    assert set(got) == set(requests)
    for rid in requests:
        assert len(got[rid]) == len(requests[rid])
        assert all(cos(a, b) >= COSINE_NO_FA for a, b in zip(alone[rid], got[rid], strict=True))
    e.close()


def test_a_short_request_arriving_behind_a_long_one_goes_in_the_next_decode(random_model):
    e = Engine(random_model, n_batch=64, flash_attn=False)
    e.submit(1, [f"document {i} of a long ingestion" for i in range(100)])
    e.embedder.step()
    e.submit(2, ["a query"])
    finished = [ev.id for ev in e.embedder.step()]
    assert finished == [2]  # not after the long request's last input
    e.drain()
    e.close()


def test_the_sequences_a_decode_holds_are_bounded(random_model):
    e = Engine(random_model, n_batch=512, flash_attn=False)
    assert e.model.embed_seqs >= 64 and e.model.cp.n_seq_max == e.model.embed_seqs
    e.embed(["x"] * (e.model.embed_seqs + 5))
    assert e.decodes == 2
    e.close()


def test_a_cancelled_request_is_dropped_between_decodes(random_model):
    e = Engine(random_model, n_batch=32, flash_attn=False)
    e.submit(1, ["some words here"] * 40)
    e.embedder.step()
    e.submit(2, ["other"])
    e.embedder.cancel(1)
    got, decodes = e.drain(), e.decodes
    assert decodes == 1 and got == {2: [pytest.approx(e.embed(["other"])[0])]}
    e.close()


def test_reranking_in_batches_gives_each_documents_score(tmp_path):
    scores = {"!": 0.9, "?": 0.2, ".": 0.6}
    e = Engine(tm.reranker(tmp_path / "rr.gguf", scores), reranker=True)
    docs = [f"document {i}{'!?.x'[i % 4]}" for i in range(50)]
    e.decodes = 0
    got = e.embed(docs, query="which?")
    assert e.decodes <= 3  # about twenty tokens a pair, up to n_batch (512) a decode
    want = [scores.get(d[-1], 0.5) for d in docs]
    assert [round(v[0], 4) for v in got] == pytest.approx(want, abs=1e-4)
    e.close()


@pytest.mark.real
def test_gemma_batched_agrees_with_alone():
    from realmodel import gemma_path

    for flash_attn, tolerance in ((None, COSINE), (False, COSINE_NO_FA)):
        e = Engine(gemma_path(), flash_attn=flash_attn, n_ctx=1024)
        alone = [e.embed([t])[0] for t in TEXTS]
        batched = e.embed(TEXTS)
        assert min(cos(a, b) for a, b in zip(alone, batched, strict=True)) >= tolerance
        assert e.embed(TEXTS) == batched
        e.close()


# --- the real server ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(tmp_path_factory, random_model):
    d = tmp_path_factory.mktemp("embbatch")
    tm.reranker(d / "rr.gguf", {"!": 0.9})
    cfg = d / "models.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\nmodels:\n"
                   f"  emb:\n    path: {random_model}\n    embeddings: true\n    n_ctx: 256\n    flash_attn: false\n"
                   f"  rr: {d}/rr.gguf\n")
    with ServerProcess("--config", str(cfg)) as srv:
        yield srv


def post(server, path, body, timeout=60):
    req = urllib.request.Request(server.url + path, method="POST", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.slow
def test_eight_concurrent_clients_each_get_their_own_vectors(server):
    inputs = {k: [f"client {k} sentence {i} about rivers" for i in range(k % 3 + 1)] for k in range(8)}
    alone = {k: [post(server, "/v1/embeddings", {"model": "emb", "input": x})[1]["data"][0]["embedding"]
                 for x in xs] for k, xs in inputs.items()}

    async def all_at_once():
        loop = asyncio.get_running_loop()
        return await asyncio.gather(*(loop.run_in_executor(None, post, server, "/v1/embeddings",
                                                           {"model": "emb", "input": xs})
                                      for xs in inputs.values()))

    for _ in range(3):
        for k, (status, body) in enumerate(asyncio.run(all_at_once())):
            assert status == 200, body
            assert [d["index"] for d in body["data"]] == list(range(len(inputs[k])))
            assert body["usage"]["prompt_tokens"] > 0
            for a, d in zip(alone[k], body["data"], strict=True):
                assert cos(a, d["embedding"]) >= COSINE_NO_FA


@pytest.mark.slow
def test_hostile_sizes_are_refused_and_the_model_keeps_serving(server):
    status, body = post(server, "/v1/embeddings", {"model": "emb", "input": ["ok", "word " * 400]})
    assert status == 400 and body["error"]["param"] == "input" and "input 1 has" in body["error"]["message"]
    assert body["error"]["code"] == "context_length_exceeded"
    status, body = post(server, "/v1/embeddings", {"model": "emb", "input": []})
    assert status == 400 and body["error"]["param"] == "input"
    status, body = post(server, "/v1/embeddings", {"model": "emb", "input": [[1, 2], [10 ** 9]]})
    assert status == 400 and body["error"]["param"] == "input"
    status, body = post(server, "/v1/embeddings", {"model": "emb", "input": ["x"] * 2049})
    assert status == 400 and body["error"]["param"] == "input"
    status, body = post(server, "/v1/embeddings", {"model": "emb", "input": ["ok", "word " * 200_000]})
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"  # refused before it is read
    # the most inputs a request may give, each a quarter of the context: a few dozen decodes
    status, body = post(server, "/v1/embeddings", {"model": "emb", "input": ["word " * 60] * 2048}, timeout=300)
    assert status == 200 and len(body["data"]) == 2048
    status, body = post(server, "/v1/embeddings", {"model": "emb", "input": "still serving"})
    assert status == 200 and len(body["data"]) == 1


@pytest.mark.slow
def test_rerank_of_fifty_documents(server):
    docs = [f"doc {i}{'!' if i % 5 == 0 else ''}" for i in range(50)]
    status, body = post(server, "/v1/rerank", {"model": "rr", "query": "q", "documents": docs})
    assert status == 200 and len(body["results"]) == 50
    got = {r["index"]: r["relevance_score"] for r in body["results"]}
    assert got == pytest.approx({i: 0.9 if i % 5 == 0 else 0.5 for i in range(50)}, abs=1e-4)

