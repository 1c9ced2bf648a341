"""Reranking on the real `gguf-gateway serve` process: a generated Qwen3-style reranker whose
scores are known in advance (testmodels.reranker), in llama.cpp's / Jina's / Cohere's shape on
each of the routes, found by its header whether configured or discovered, and 501 or 400
where it does not apply."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from helpers import ServerProcess

from gateway.models import testmodels as tm

pytestmark = pytest.mark.slow

SCORES = {"!": 0.9, "?": 0.2, ".": 0.6}
DOCS = ["I like apple!", "a banana?", "cherry.", "nothing here", {"text": "apple pie!"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("rerank")
    found = d / "found"
    found.mkdir()
    tm.reranker(d / "rr.gguf", SCORES)
    tm.reranker(found / "other-reranker.gguf", {"x": 0.99})
    tm.plain(d / "plain.gguf", ["Hello"])
    cfg = d / "models.yaml"
    cfg.write_text(f"server:\n  discover_default_stores: false\n  models_dirs: [{found}]\nmodels:\n"
                   f"  rr: {d}/rr.gguf\n  plain: {d}/plain.gguf\n")
    with ServerProcess("--config", str(cfg)) as srv:
        yield srv


def post(server, path, body):
    req = urllib.request.Request(server.url + path, method="POST", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v1/reranking"])
def test_scores_come_out_as_built_best_first(server, path):
    status, body = post(server, path, {"model": "rr", "query": "fruit", "documents": DOCS})
    assert status == 200 and body["model"] == "rr" and body["usage"]["prompt_tokens"] > 0
    got = {r["index"]: r["relevance_score"] for r in body["results"]}
    assert got == pytest.approx({0: 0.9, 1: 0.2, 2: 0.6, 3: 0.5, 4: 0.9}, abs=1e-4)
    assert [r["index"] for r in body["results"]] == [0, 4, 2, 3, 1]  # best first, equals in document order
    assert all("document" not in r for r in body["results"])


def test_top_n_and_return_documents(server):
    status, body = post(server, "/v1/rerank", {"model": "rr", "query": "q", "documents": DOCS, "top_n": 2,
                                               "return_documents": True})
    assert status == 200 and [r["document"]["text"] for r in body["results"]] == ["I like apple!", "apple pie!"]


def test_a_discovered_reranker_is_known_by_its_header(server):
    status, body = post(server, "/v1/rerank", {"model": "other-reranker", "query": "q", "documents": ["ax", "b"]})
    assert status == 200 and body["results"][0] == {"index": 0, "relevance_score": pytest.approx(0.99, abs=1e-4)}


@pytest.mark.parametrize("path, body, status, param, words", [
    ("/v1/rerank", {"model": "plain", "query": "q", "documents": ["a"]}, 501, "model", "is not a reranker"),
    ("/v1/chat/completions", {"model": "rr", "messages": [{"role": "user", "content": "hi"}]}, 501, "model",
     "is a reranker: use /v1/rerank"),
    ("/v1/embeddings", {"model": "rr", "input": "hi"}, 501, "model", "cannot embed"),
    ("/v1/rerank", {"model": "rr", "documents": ["a"]}, 400, "query", "query"),
    ("/v1/rerank", {"model": "rr", "query": "q", "documents": []}, 400, "documents", "documents"),
    ("/v1/rerank", {"model": "rr", "query": "q", "documents": ["a", 5]}, 400, "documents[1]", "documents[1]"),
    ("/v1/rerank", {"model": "rr", "query": "q", "documents": ["a"], "top_n": 0}, 400, "top_n", "top_n"),
    ("/v1/rerank", {"model": "nope", "query": "q", "documents": ["a"]}, 404, "model", "does not exist"),
])
def test_what_does_not_apply_is_named(server, path, body, status, param, words):
    got, answer = post(server, path, body)
    assert got == status and answer["error"]["param"] == param and words in answer["error"]["message"]
