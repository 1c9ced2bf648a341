"""The Backend protocol's local implementation: what it serves, and the device it names."""

from types import SimpleNamespace

import pytest

from gateway.backends.local import CHAT, COMPLETIONS, EMBEDDINGS, TOKENIZE
from gateway.backends.workerclient import WorkerProcess
from gateway.protocol import LoadParams
from gateway.worker.model import _device


def test_a_model_serves_text_or_vectors():
    assert WorkerProcess(LoadParams("m", "m.gguf")).serves == {CHAT, COMPLETIONS, TOKENIZE}
    assert WorkerProcess(LoadParams("e", "e.gguf", embeddings=True)).serves == {EMBEDDINGS, TOKENIZE}


@pytest.mark.parametrize("info, device", [
    ("CPU : SSE3 = 1 | AVX2 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | ", "cpu"),
    ("CUDA : ARCHS = 890 | USE_GRAPHS = 1 | PEER_MAX_BATCH_SIZE = 128 | CPU : SSE3 = 1 | AVX2 = 1 | ", "cuda"),
    ("Metal : EMBED_LIBRARY = 1 | CPU : NEON = 1 | ARM_FMA = 1 | ACCELERATE = 1 | ", "metal"),
])
def test_the_device_is_the_first_backend_llama_cpp_was_built_with_beside_the_cpu(info, device):
    ll = SimpleNamespace(llama_print_system_info=lambda: info.encode())  # llama.cpp's system info line
    assert _device(ll) == device
