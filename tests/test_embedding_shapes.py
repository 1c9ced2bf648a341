"""The embedding models people serve, in small: a BERT encoder in bge-small's form (WordPiece
vocabulary, mean pooling of its own, no output head) and a decoder embedder in
Qwen3-Embedding's (last-token pooling of its own, grouped-query attention with heads wider than
n_embd / n_head, no ``output.weight``), written by ``testmodels.write_random_model`` at test
sizes (``scripts/embedbench.py`` writes them at full size for ``bench.py --embeddings``).

Each loads in the gateway's real worker, keeps its own pooling (the gateway mean-pools only a
model with none), and gives vectors of its own width; and a text's vector is the same alone as
among others in one batch, to the stated tolerance of ``tests/test_embedding_batch`` without
flash attention, while different texts' vectors lie far outside it (so a vector handed to the
wrong input, or positions that run on from one input into the next, fail it)."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from helpers import REPO, ServerProcess

from gateway.models import testmodels as tm

COSINE_NO_FA = 0.9998  # tests/test_embedding_batch's tolerance, batched against alone without flash attention

# (the vocabulary, write_random_model's shape): widths differ, so a vector's length is the model's own
SHAPES: dict[str, tuple[str, dict]] = {
    "bge": ("bert-bge", dict(arch="bert", n_embd=96, n_layer=2, n_head=4, n_ff=192, context_length=512,
                             pooling="mean")),
    "qwen3emb": ("qwen2", dict(arch="qwen3", n_embd=64, n_layer=2, n_head=4, n_head_kv=2, head_dim=32, n_ff=128,
                               context_length=4096, pooling="last", output_head=False)),
}
TEXTS = ["hello world", "The quick brown fox jumps over the lazy dog.", "a", "Embeddings are vectors.",
         "x " * 60, "naïve café 日本語 🙂", "def f(x):\n    return x * 2\n"]


def shaped_model(name: str) -> Path:
    """The ``name`` shape's model, written once into the repository's cache and kept."""
    vocab, shape = SHAPES[name]
    path = REPO / ".cache" / "models" / f"random-{name}-shape-tiny.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tm.write_random_model(path.with_suffix(".part"), tm.find_vocab(vocab, cache_dir=REPO / ".cache" / "vocab"),
                              seed=3, **shape)
        path.with_suffix(".part").replace(path)
    return path


def cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / (math.hypot(*a) * math.hypot(*b))


def test_the_writer_refuses_what_it_cannot_write(tmp_path):
    vocab = tm.find_vocab("bert-bge", cache_dir=REPO / ".cache" / "vocab")
    with pytest.raises(ValueError, match="no random 'mamba'"):
        tm.write_random_model(tmp_path / "m.gguf", vocab, arch="mamba")
    with pytest.raises(ValueError, match="pooling is one of"):
        tm.write_random_model(tmp_path / "m.gguf", vocab, arch="bert", pooling="max")


@pytest.mark.parametrize("name,pooling", [("bge", "MEAN"), ("qwen3emb", "LAST")])
def test_each_shape_keeps_its_own_pooling_and_width(name, pooling):
    from gateway import protocol
    from gateway.worker.model import Model

    model = Model(protocol.LoadParams(name=name, path=str(shaped_model(name)), embeddings=True, n_ctx=512, n_threads=2))
    ll = model.ll
    assert ll.llama_pooling_type(model.ctx) == getattr(ll, f"LLAMA_POOLING_TYPE_{pooling}")
    assert model.n_embd == SHAPES[name][1]["n_embd"]
    assert bool(model.mem) is (name == "qwen3emb")  # a BERT reads without a cache (llama.cpp encodes it)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("shapes")
    cfg = d / "models.yaml"
    cfg.write_text("server:\n  discover_default_stores: false\nmodels:\n" + "".join(
        f"  {name}:\n    path: {shaped_model(name)}\n    embeddings: true\n    flash_attn: false\n    n_threads: 2\n"
        for name in SHAPES))
    with ServerProcess("--config", str(cfg)) as srv:
        yield srv


def embed(server, model: str, inputs: list[str]) -> list[list[float]]:
    req = urllib.request.Request(server.url + "/v1/embeddings", method="POST",
                                 data=json.dumps({"model": model, "input": inputs}).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise AssertionError(f"HTTP {e.code}: {e.read()[:300]!r}") from None
    assert [d["index"] for d in body["data"]] == list(range(len(inputs)))
    assert body["usage"]["prompt_tokens"] >= len(inputs)
    return [d["embedding"] for d in body["data"]]


@pytest.mark.parametrize("name", list(SHAPES))
def test_the_real_worker_embeds_each_shape_at_its_width(server, name):
    vectors = embed(server, name, TEXTS[:3])
    assert len(vectors) == 3
    for v in vectors:
        assert len(v) == SHAPES[name][1]["n_embd"]
        assert math.isclose(math.hypot(*v), 1.0, rel_tol=1e-5)  # normalized


@pytest.mark.parametrize("name", list(SHAPES))
def test_a_text_is_embedded_the_same_alone_as_in_a_batch(server, name):
    alone = [embed(server, name, [t])[0] for t in TEXTS]
    batched = embed(server, name, TEXTS)
    for text, a, b in zip(TEXTS, alone, batched, strict=True):
        assert cos(a, b) >= COSINE_NO_FA, text
    # what the tolerance tells apart: every other text's vector is far outside it
    others = max(cos(alone[i], alone[j]) for i in range(len(TEXTS)) for j in range(len(TEXTS)) if i != j)
    assert others < 0.99
