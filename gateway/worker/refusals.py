"""What a worker answers instead of a result: a request it will not run (``Refused``), or one a
bug stopped (``failure``). Either becomes the request's error event, and ends that request alone."""

from __future__ import annotations

from .. import protocol


class Refused(Exception):
    """A request the worker will not run: reported to the caller as an error event."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def event(self, rid: int) -> protocol.Error:
        return protocol.Error(rid, self.status, self.message, self.param, self.code)


def failure(rid: int, e: Exception) -> protocol.Error:
    """A bug met while serving request ``rid``: it fails that request alone."""
    return protocol.Error(rid, 500, f"{type(e).__name__}: {e}", None, "worker_error")


def decode_failed(rid: int, rc: int) -> protocol.Error:
    """llama_decode's status ``rc`` for a request it failed: 1 is no room in the cache, which
    only a shared pool (kv_unified) runs out of while requests fit (a 503 to retry)."""
    if rc == 1:
        return protocol.Error(rid, 503, "the model's shared context (kv_unified) is full with other requests; retry "
                                   "shortly, or give it a larger n_ctx", None, "context_full", 2.0)
    return protocol.Error(rid, 500, f"llama_decode failed with status {rc}", None, "decode_failed")
