"""Fill-in-the-middle wire shapes: llama-server's ``/infill`` (its request, and its answer in
the shape of its ``/completion``) and Mistral's ``/v1/fim/completions`` (answered in Mistral's
shape, which is OpenAI's chat completion's: ``choices[0].message.content``, streamed as
``choices[0].delta.content``, as Continue reads it; ``openai_answer.Renderer``'s "fim" kind).
``suffix`` on ``/v1/completions`` and Ollama's ``/api/generate`` are read by their own parsers
with ``read_suffix``.

The prompt itself is laid out in the model's worker from its FIM tokens (worker/infill.py);
here a request becomes a ``GenerationRequest`` with ``suffix`` set.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..backends.upstream_wire.fill import FIM_FORWARDED
from ..base.errors import ApiError, InvalidRequest
from ..protocol import GenerationRequest, Start, bounds
from . import writer
from .answer import Finish, Item, Piece
from .context import Context
from .params import SAMPLING, Parsed, model_name, read_lora, read_sampling, read_stops, shown
from .writer import Frame

MAX_EXTRA = 1024  # input_extra chunks (each is tokenized; the body's size bounds their text)
MAX_FILENAME = 1024  # characters of a chunk's filename
# More bytes than one token stands for in the vocabularies models ship with (their longest
# pieces are runs of spaces or punctuation), for ``extra_budget``: a cut by this many bytes a
# token drops only what the layout could not have kept, unless the kept text's tokens averaged
# more than this
MAX_TOKEN_BYTES = 128


def read_suffix(body: dict[str, Any], name: str = "suffix") -> str | None:
    """The text after the cursor, or None for a plain completion (absent, null or "")."""
    value = body.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise InvalidRequest(f"`{name}` must be a string, got {shown(value)}", name)
    return value


def require_fim(info: dict[str, Any], model: str, param: str) -> None:
    """Refuse fill-in-the-middle on a model that did not report FIM tokens (the layout needs
    the vocabulary; the worker checks again), or whose upstream server is not sent FIM
    requests: never a completion with the suffix dropped."""
    if info.get("fim") == FIM_FORWARDED:
        return
    if info.get("upstream"):
        raise ApiError(f"model {model!r} is answered by an upstream server, and fill-in-the-middle is not served "
                       f"through it; leave out `{param}` for a plain completion", status=501, param=param,
                       code="fim_not_supported")
    if not info.get("fim"):
        raise ApiError(f"model {model!r} cannot fill in the middle: its vocabulary has no FIM prefix, suffix "
                       f"and middle tokens (tokenizer.ggml.fim_*_token_id); leave out `{param}` for a plain "
                       "completion", status=400, param=param, code="fim_not_supported")


def _model(body: dict[str, Any]) -> str:
    """The request's ``model``, or "" where it names none (``choose_model`` picks one)."""
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise InvalidRequest("`model` must be the name of a model on this gateway (see /v1/models)", "model")
    return model_name(model) if model else ""


def choose_model(candidates: list[tuple[str, bool | None]]) -> str:
    """The model a FIM request that names none goes to, as llama-server's editor clients
    (llama.vscode, llama.vim) send it: ``candidates`` are the gateway's text models, each with
    whether it can fill in the middle (its GGUF header's FIM tokens; None: not known before it
    loads, as an upstream's). The only model, as on every route that takes a missing ``model``
    (it then answers for itself); else the only one that can fill in the middle; else a 400 on
    ``model`` naming the candidates."""
    if len(candidates) == 1:
        return candidates[0][0]
    able = [name for name, fim in candidates if fim]
    if len(able) == 1:
        return able[0]
    if able:
        raise InvalidRequest(f"`model` is required: {len(able)} models on this gateway can fill in the middle "
                             f"({', '.join(able)}); name one", "model")
    unknown = [name for name, fim in candidates if fim is None]
    known = (f"; not known before they load: {', '.join(unknown)}" if unknown else "")
    raise InvalidRequest(f"`model` is required: none of this gateway's {len(candidates)} models is known to fill "
                         f"in the middle (no FIM tokens in their GGUF headers{known}); name one", "model")


def _stream(body: dict[str, Any]) -> bool:
    stream = body.get("stream", False)
    if stream is None:
        return False
    if not isinstance(stream, bool):
        raise InvalidRequest("`stream` must be true or false", "stream")
    return stream


def _max_tokens(body: dict[str, Any], names: tuple[str, ...]) -> int | None:
    """The first of ``names`` set: a positive count; llama-server's ``n_predict`` -1 is no limit."""
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if name == "n_predict" and type(value) is int and value == -1:
            return None
        problem = SAMPLING["max_tokens"].problem(value)
        if problem:
            raise InvalidRequest(f"`{name}` {problem}, got {shown(value)}", name)
        return value
    return None


def _string(body: dict[str, Any], name: str, required: bool) -> str:
    value = body.get(name)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise InvalidRequest(f"`{name}` must be a string" + (" (it is required)" if value is None else
                                                              f", got {shown(value)}"), name)
    return value


def read_extra(value: Any, name: str = "input_extra") -> list[dict[str, str]]:
    """llama-server's ``input_extra``: other files as context, ``[{"filename", "text"}]``
    (``filename`` optional, "tmp" as llama-server names it), as its /infill checks them."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidRequest(f'`{name}` must be an array of {{"filename": string, "text": string}}', name)
    if len(value) > MAX_EXTRA:
        raise InvalidRequest(f"`{name}` may hold at most {MAX_EXTRA} chunks, got {len(value)}", name)
    out = []
    for i, chunk in enumerate(value):
        where = f"{name}[{i}]"
        if not isinstance(chunk, dict):
            raise InvalidRequest(f'`{where}` must be an object {{"filename": string, "text": string}}', where)
        if not isinstance(chunk.get("text"), str):
            raise InvalidRequest(f"`{where}.text` must be a string", f"{where}.text")
        filename = chunk.get("filename", "tmp")
        if not isinstance(filename, str) or len(filename) > MAX_FILENAME:
            raise InvalidRequest(f"`{where}.filename` must be a string of at most {MAX_FILENAME} characters",
                                 f"{where}.filename")
        out.append({"filename": filename, "text": chunk["text"]})
    return out


def extra_budget(info: dict[str, Any], max_tokens: int | None) -> int | None:
    """The bytes of ``input_extra`` (file names and texts together) that can reach a model's
    prompt, from what its backend reported (``info``: ``n_ctx``, ``n_batch``): the layout keeps at
    most the last ``n_ctx - n_batch - 2 * n_predict`` tokens of the extra context (llama-server's
    rule, ``worker/infill.layout``), so no more than ``MAX_TOKEN_BYTES`` for each of them, and a
    few more for the token a cut splits. None where the backend does not say (an upstream's
    server lays its prompt out itself). Pure."""
    n_ctx, n_batch = info.get("n_ctx"), info.get("n_batch")
    if type(n_ctx) is not int or type(n_batch) is not int:
        return None
    n_predict = -1 if max_tokens is None else max_tokens
    return (bounds.extra_room(n_ctx, n_batch, n_predict) + bounds.MARGIN) * MAX_TOKEN_BYTES


def trim_extra(extra: list[dict[str, str]], budget: int) -> list[dict[str, str]]:
    """``extra`` cut to what its model can keep (``budget`` bytes, ``extra_budget``) before the
    worker tokenizes it: the newest chunks whose file names and texts hold at most ``budget``
    bytes together, and the one that crosses it with its text cut to its end (whole
    characters). Tokenizing takes time and memory that grow with a text, faster than it on some
    vocabularies, and the layout keeps only the extra context's end: a chunk of megabytes, or a
    thousand long file names, cost seconds and hundreds of megabytes of the worker for tokens
    it then dropped. Pure."""
    out: list[dict[str, str]] = []
    for chunk in reversed(extra):
        text, name = chunk["text"], chunk["filename"]
        size = len(name.encode("utf-8")) + 1 + len(text.encode("utf-8"))  # the name's line, then the text
        if size <= budget:
            out.append(chunk)
            budget -= size
            continue
        if budget > 0:  # the crossing chunk: its text's end (its name, at most MAX_FILENAME, as it is)
            data = text.encode("utf-8")
            out.append({"filename": name, "text": data[len(data) - budget:].decode("utf-8", "ignore")
                        if len(data) > budget else text})
        break
    return out[::-1]


MAX_FIELDS = 64  # response_fields' paths


@dataclass
class InfillParsed(Parsed):
    # llama-server's ``response_fields``: the final answer holds only these paths ("timings/prompt_n"),
    # each under its path as one key, as llama.vim asks for and reads them
    response_fields: list[str] = field(default_factory=list)


def _paths(value: Any) -> list[str]:
    if value is None:
        return []
    if (not isinstance(value, list) or len(value) > MAX_FIELDS
            or not all(isinstance(p, str) and len(p) <= 256 for p in value)):
        raise InvalidRequest(f"`response_fields` must be an array of at most {MAX_FIELDS} paths "
                             '("content", "timings/prompt_n", ...)', "response_fields")
    return value


def pick(paths: list[str], body: dict[str, Any]) -> dict[str, Any]:
    """``body`` cut to ``paths`` (llama-server's ``json_get_nested_values``): each path that leads
    somewhere, under the path itself as a key; none given: the whole body."""
    if not paths:
        return body
    out: dict[str, Any] = {}
    for path in paths:
        current: Any = body
        for key in path.split("/"):
            if not isinstance(current, dict) or key not in current:
                break
            current = current[key]
        else:
            out[path] = current
    return out


def parse_infill(body: dict[str, Any]) -> InfillParsed:
    """llama-server's /infill: ``input_prefix`` and ``input_suffix`` (both required, as there),
    ``input_extra``, ``prompt`` (after the prefix), ``n_predict`` / ``max_tokens``, ``stream``,
    ``stop`` and the sampling fields. ``model`` may be left out (the handler settles it with
    ``choose_model``: ``Parsed.model`` is "" then); ``response_fields``. Other
    llama-server fields (``cache_prompt``, ``t_max_prompt_ms``, ``samplers``, ``n_indent``, ...)
    are ignored."""
    model = _model(body)
    req = GenerationRequest(prompt=_string(body, "input_prefix", True), suffix=_string(body, "input_suffix", True),
                            infill_extra=read_extra(body.get("input_extra")),
                            infill_prompt=_string(body, "prompt", False), suffix_param="input_suffix")
    req.max_tokens = _max_tokens(body, ("n_predict", "max_tokens"))
    explicit = read_sampling(body, req, SAMPLING)
    req.stop = read_stops(body.get("stop"), "stop")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise InvalidRequest("`ignore_eos` must be true or false", "ignore_eos")
    req.ignore_eos = ignore_eos
    req.lora = read_lora(body.get("lora"))  # llama-server's per-request adapters, as on its completions
    return InfillParsed(model or "", req, _stream(body), explicit=explicit,
                        response_fields=_paths(body.get("response_fields")))


def parse_fim(body: dict[str, Any]) -> Parsed:
    """Mistral's /v1/fim/completions: ``model``, ``prompt`` (before the cursor), ``suffix``
    (after it; absent: a plain completion of the prompt, as Mistral's), ``stop``,
    ``max_tokens`` (or ``min_tokens``, ignored), ``stream``, ``temperature``, ``top_p``,
    ``random_seed`` (Mistral's name for ``seed``). ``model`` may be left out, as on /infill
    (the handler settles it: ``Parsed.model`` is "" then)."""
    model = _model(body)
    req = GenerationRequest(prompt=_string(body, "prompt", True), suffix=read_suffix(body))
    if req.suffix is None:
        req.suffix = ""  # Mistral's FIM route lays a prompt out as FIM, whatever follows it
    seed = body.get("random_seed")
    if seed is not None and body.get("seed") is None:
        body = {**body, "seed": seed}
    explicit = read_sampling(body, req, SAMPLING)
    req.max_tokens = _max_tokens(body, ("max_tokens",))
    req.stop = read_stops(body.get("stop"), "stop")
    return Parsed(model, req, _stream(body), explicit=explicit)  # streamed: the usage rides on the last chunk


# --- llama-server's /completion answer shape -------------------------------------------------

def stop_type(finish: Finish) -> str:
    """llama-server's ``stop_type``: eos (the model ended), word (a stop string), limit."""
    if finish.reason == "length":
        return "limit"
    if finish.reason in ("stop", "tool_calls"):
        return "word" if finish.stop else "eos"
    return "none"


def timings(finish: Finish, started: float, first: float | None, last: float | None) -> dict[str, float | int]:
    """llama-server's ``timings`` from this side of the worker: the prompt's time is until the
    first token arrived, the prediction's from then to the last (monotonic seconds)."""
    first = first if first is not None else last if last is not None else started
    last = last if last is not None else first
    prompt_ms, predicted_ms = max(0.0, first - started) * 1000, max(0.0, last - first) * 1000
    n_prompt = max(0, finish.prompt_tokens - finish.cached_tokens)
    n_gen = finish.completion_tokens

    def per(ms: float, n: int) -> tuple[float, float]:
        return (ms / n if n else 0.0), (1000 * n / ms if ms > 0 else 0.0)

    p_tok, p_sec = per(prompt_ms, n_prompt)
    g_tok, g_sec = per(predicted_ms, max(0, n_gen - 1))
    return {"cache_n": finish.cached_tokens, "prompt_n": n_prompt, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": p_tok, "prompt_per_second": p_sec, "predicted_n": n_gen,
            "predicted_ms": predicted_ms, "predicted_per_token_ms": g_tok, "predicted_per_second": g_sec}


def partial(content: str, predicted: int, evaluated: int) -> dict[str, Any]:
    """One streamed piece, as llama-server's /completion streams it (``data: {...}``, no [DONE])."""
    return {"index": 0, "content": content, "tokens": [], "stop": False, "id_slot": -1,
            "tokens_predicted": predicted, "tokens_evaluated": evaluated}


def final(model: str, content: str, finish: Finish, timing: dict[str, Any], req: GenerationRequest) -> dict[str, Any]:
    """The whole answer (or, streamed, the last event with ``content`` ""), llama-server's
    ``to_json_non_oaicompat``."""
    return {"index": 0, "content": content, "tokens": [], "id_slot": -1, "stop": True, "model": model,
            "tokens_predicted": finish.completion_tokens, "tokens_evaluated": finish.prompt_tokens,
            "generation_settings": generation_settings(req), "prompt": "", "has_new_line": "\n" in content,
            "truncated": False, "stop_type": stop_type(finish), "stopping_word": finish.stop or "",
            "tokens_cached": finish.cached_tokens, "timings": timing}


def generation_settings(req: GenerationRequest) -> dict[str, Any]:
    """The sampling settings in llama-server's names (``task_params::to_json``), as far as this
    gateway has them; also /props' ``default_generation_settings.params``."""
    n_predict = -1 if req.max_tokens is None else req.max_tokens
    return {"seed": -1 if req.seed is None else req.seed, "temperature": req.temperature, "top_k": req.top_k,
            "top_p": req.top_p, "min_p": req.min_p, "repeat_penalty": req.repeat_penalty,
            "presence_penalty": req.presence_penalty, "frequency_penalty": req.frequency_penalty,
            "max_tokens": n_predict, "n_predict": n_predict, "ignore_eos": req.ignore_eos, "stream": False,
            "stop": list(req.stop), "n_probs": 0}


class InfillWriter(writer.Writer):
    """llama-server's /infill answer (its /completion shape): whole, one object with every piece
    (an upstream's thinking too) as its text; streamed, ``data: {...}`` per piece and the final
    object last, no ``[DONE]``. Its timings are read from the request's observation, from the
    lease on."""

    def __init__(self, parsed: InfillParsed, ctx: Context):
        super().__init__(parsed.model, parsed.stream)
        self.parsed, self.obs = parsed, ctx.observation
        self.id = f"for {parsed.model} (infill)"
        self.started = time.monotonic()
        self.evaluated = 0
        self.text: list[str] = []
        self._whole: dict[str, Any] = {}

    def leased(self, model: str) -> None:
        super().leased(model)
        self.id = f"for {model} (infill)"
        self.started = time.monotonic()

    def open(self, begun: Start) -> list[Frame]:
        self.evaluated = begun.prompt_tokens
        return []

    def feed(self, item: Item) -> list[Frame]:
        if not isinstance(item, Piece):
            return []
        if not self.stream:
            self.text.append(item.text)
            return []
        predicted = 1 + len(self.obs.gaps) if self.obs.first_token is not None else 0
        return [(partial(item.text, predicted, self.evaluated), None)]

    def close(self, finish: Finish) -> list[Frame]:
        timing = timings(finish, self.started, self.obs.first_token, self.obs.last_token)
        body = pick(self.parsed.response_fields,
                    final(self.model, "".join(self.text), finish, timing, self.parsed.request))
        if not self.stream:
            self._whole = body
            return []
        return [(body, None)]

    def fail(self, err: ApiError) -> list[Frame]:
        return [(err.openai_body(), None)]

    def body(self) -> dict[str, Any]:
        return self._whole
