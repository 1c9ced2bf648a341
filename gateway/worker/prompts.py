"""Reading prompts: a request's messages through the model's chat template, a text refused
before tokenizing when it cannot fit, the tokens, and the checks a generation needs before it
takes a slot (``prepare``); also the answers to tokenize, detokenize and apply_template.

Everything here is thread-safe and runs on the worker's prep threads (or in its loop for a
short prompt while nothing decodes): reading a long prompt never stalls the decoding of others.
"""

from __future__ import annotations

import functools
import json
from typing import Any, NamedTuple

from .. import protocol
from ..protocol import bounds
from ..text import chat_template
from ..text.grammar import MAX_MADE_GRAMMAR_CHARS, grammar_problem
from ..text.reasoning import ReasoningSplitter
from . import infill
from .media import Run
from .model import Model
from .refusals import Refused, failure
from .sampling import structured_grammar
from .toolhistory import for_template

PROMPT_TAIL = 256  # characters of a prompt's text kept for the start event

PromptQuestion = protocol.Tokenize | protocol.Detokenize | protocol.ApplyTemplate  # answered without decoding
Source = protocol.GenerationRequest | protocol.PromptRequest  # what a prompt is read from


class PromptTokens(NamedTuple):
    tokens: list[int]
    tail: str  # the end of the prompt's text, where a chat template may have opened a thinking block
    runs: dict[int, Run] | None = None  # its pictures and sounds by start (``media``), encoded


class Prompts:
    def __init__(self, model: Model):
        self.model, self.vocab = model, model.vocab
        self.n_ctx = model.n_ctx  # a slot's context

    def tokens(self, req: Source, add_special: bool = True, param: str | None = None) -> PromptTokens:
        """The prompt as tokens, and the end of its text. A text that cannot fit is refused
        untokenized; ``param`` names the field in the refusal."""
        if isinstance(req, protocol.GenerationRequest) and req.suffix is not None:
            return self.infill(req)
        param = param or ("messages" if req.messages is not None else "prompt")
        if req.prompt_tokens is not None:
            return PromptTokens(self.vocab.known_ids(req.prompt_tokens, param), "")
        text = self.render(req) if req.messages is not None else req.prompt or ""
        self.check_fits(text, param)
        if req.media:
            return self.with_media(req, text, add_special)
        return PromptTokens(self.vocab.tokenize(text, add_special=add_special), text[-PROMPT_TAIL:])

    def with_media(self, req: Source, text: str, add_special: bool) -> PromptTokens:
        """A prompt with pictures or sounds, read by the model's projector (``media``): counted
        here, encoded by ``prepare`` once the prompt fits."""
        projector = self.model.projector
        first = req.media[0]
        if projector is None or not (projector.vision if first.kind == "image" else projector.audio):
            raise Refused(400, f"model {self.model.params.name!r} does not take "
                               f"{'images' if first.kind == 'image' else 'audio'}", first.param,
                          f"{first.kind}_not_supported")
        generating = isinstance(req, protocol.GenerationRequest)
        tokens, runs = projector.tokenize(text, req.media, add_special)
        if not generating:
            projector.free(runs)
            return PromptTokens(tokens, text[-PROMPT_TAIL:])
        if tokens and tokens[-1] < 0:
            projector.free(runs)
            raise Refused(400, "a prompt cannot end with a picture or a sound: put text after it", first.param)
        return PromptTokens(tokens, text[-PROMPT_TAIL:], runs)

    def infill(self, req: protocol.GenerationRequest) -> PromptTokens:
        """A fill-in-the-middle prompt: ``prompt`` before the cursor, ``suffix`` after it, the
        extra files before both, in the model's FIM tokens (``infill.layout``, llama-server's
        layout). A vocabulary without them is a 400 naming the suffix's field. What the layout
        cannot keep is cut (by bytes) before tokenizing: the prefix, the suffix, and the extra
        files (``infill.recent``: names and texts together), each to (the tokens the layout keeps
        of it + ``bounds.MARGIN``) times the vocabulary's longest piece in bytes."""
        vocab, fim = self.vocab, self.vocab.fim
        if missing := fim.missing():
            raise Refused(400, f"model {self.model.params.name!r} cannot fill in the middle: its vocabulary has no "
                               f"FIM {', '.join(missing)} token (tokenizer.ggml.fim_*_token_id); leave out "
                               f"`{req.suffix_param}` for a plain completion", req.suffix_param, "fim_not_supported")
        self.check_fits(req.infill_prompt, "prompt")
        n_batch, n_predict = self.model.cp.n_batch, -1 if req.max_tokens is None else req.max_tokens
        room = bounds.extra_room(self.n_ctx, n_batch, n_predict)  # tokens of the extra context kept at most
        extra = [infill.Extra(e.get("filename", "tmp"), e["text"]) for e in req.infill_extra]
        # Cut at more bytes than the kept tokens can stand for (MARGIN: a cut may split a token),
        # so the model reads the same prompt. Texts of at most the kept tokens' count in bytes
        # are never cut (a character is at most 4 bytes), nor is anything kept where no extra
        # context is: the vocabulary's scan is spared there.
        side_bytes = 4 * max(len(req.prompt or ""), len(req.suffix or ""))
        extra_bytes = 4 * sum(len(e.filename) + len(e.text) + len(infill.SNIPPET) for e in extra) \
            + len(infill.REPO) + len(infill.CURRENT_FILE)
        longest = vocab.longest_piece() if side_bytes > n_batch or extra_bytes > room > 0 else 1

        def plain(text: str) -> list[int]:  # a caller's code: special tokens written in it stay text
            return vocab.tokenize(text, add_special=False, parse_special=False)

        keep = (n_batch + bounds.MARGIN) * longest  # more bytes than the layout's share of a batch can hold
        extra = infill.recent(fim, extra, room, (room + bounds.MARGIN) * longest)
        prefix, suffix = infill.tail_bytes(req.prompt or "", keep), infill.head_bytes(req.suffix or "", keep)
        tokens = infill.layout(
            fim, plain, plain(prefix), plain(suffix), vocab.tokenize(req.infill_prompt, add_special=False), extra,
            n_batch=n_batch, n_predict=n_predict, n_ctx=self.n_ctx,
            bos=vocab.bos if vocab.add_bos and vocab.bos >= 0 else None, spm=self.model.params.spm_infill)
        return PromptTokens(tokens, req.infill_prompt[-PROMPT_TAIL:])

    def check_fits(self, text: str, param: str) -> None:
        """Refuse, before tokenizing it, a text that cannot fit in a slot's context (tokenizing
        costs time that grows faster than the text on some vocabularies)."""
        size = len(text.encode("utf-8", "replace"))
        if size <= self.n_ctx:  # fits whatever the vocabulary (no scan for it)
            return
        longest = self.vocab.longest_piece()
        if size > self.n_ctx * longest:
            least = -(-size // longest)
            raise Refused(400, f"This model's maximum context length is {self.n_ctx} tokens. However, the "
                               f"{param} is {size} bytes long, at least {least} tokens (no token of this model "
                               f"stands for more than {longest} bytes). Please reduce the {param}.",
                          param, "context_length_exceeded")

    def prepare(self, req: protocol.GenerationRequest) -> PromptTokens:
        """What admission needs, worked out off the decode loop (in a prep thread): the grammar
        of a ``response_format``, and the prompt's tokens and text tail, checked against the
        context. Raises ``Refused``."""
        if req.response_format:
            req.grammar = structured_grammar(req.response_format, req.json_schema, req.format_param)
        prompt = self.tokens(req)
        try:
            self._check(req, prompt)
            if prompt.runs and self.model.projector is not None:  # only a prompt that fits is encoded
                self.model.projector.encode(prompt.runs, req.media, req.cache_scope)
        except BaseException:
            if prompt.runs and self.model.projector is not None:
                self.model.projector.free(prompt.runs)
            raise
        return prompt

    def _check(self, req: protocol.GenerationRequest, prompt: PromptTokens) -> None:
        """The tool grammar of ``req``, and room in the context for its prompt and answer."""
        if req.tools and req.tool_format:
            think = None
            if req.reasoning == "think" and req.tool_choice == "required":
                think = "open" if ReasoningSplitter("think", prompt.tail).thinking else "optional"
            req.grammar, triggers = tool_grammar(req.tool_format, json.dumps(req.tools), req.tool_choice == "required",
                                                 req.tool_names, req.parallel_tool_calls, think)
            req.grammar_triggers = list(triggers)
        n_prompt = len(prompt.tokens)
        if n_prompt == 0:
            raise Refused(400, "the prompt is empty", "prompt")
        max_tokens = req.max_tokens
        room = self.n_ctx - n_prompt
        if room < 1 or (max_tokens is not None and max_tokens > room):
            want = n_prompt + (max_tokens or 0)
            raise Refused(
                400,
                f"This model's maximum context length is {self.n_ctx} tokens. However, you requested "
                f"{want} tokens ({n_prompt} in the prompt, {max_tokens or 0} for the completion). "
                "Please reduce the prompt or max_tokens.",
                "messages" if req.messages is not None else "prompt", "context_length_exceeded")

    def render(self, req: Source) -> str:
        """The request's messages through the model's chat template, as the prompt's text. A
        template that fails only with the caller's ``chat_template_kwargs`` is the caller's
        mistake (400); one that fails without them is the model's (500)."""
        extra = req.chat_template_kwargs or {}
        vocab = self.vocab
        candidates = for_template(req.messages or [], req.tools, req.tool_format, self.model.template)

        def run(variables: dict[str, Any], candidate: int = 0) -> str:
            messages, tools = candidates[candidate]
            try:
                return chat_template.render(
                    self.model.template, messages,
                    bos_token=vocab.piece(vocab.bos).decode("utf-8", "replace") if vocab.bos >= 0 else "",
                    eos_token=vocab.piece(vocab.eos).decode("utf-8", "replace") if vocab.eos >= 0 else "",
                    tools=tools, extra=variables)
            except chat_template.TemplateInputError:
                if candidate + 1 < len(candidates):  # e.g. a template that refuses the system message we added
                    return run(variables, candidate + 1)
                raise

        try:
            return run(extra)
        except chat_template.TemplateInputError as e:
            raise Refused(400, f"the model's chat template refused these messages: {e}", "messages") from None
        except chat_template.TemplateBroken as e:
            if extra:
                try:
                    run({})
                except (chat_template.TemplateInputError, chat_template.TemplateBroken):
                    pass
                else:
                    raise Refused(400, f"the model's chat template failed with these chat_template_kwargs: {e}",
                                  "chat_template_kwargs") from None
            raise Refused(500, f"model {self.model.params.name!r}: {e}", None, "chat_template_error") from None

    def answer(self, question: PromptQuestion) -> protocol.Event:
        """A question that needs no decoding: tokenize, detokenize or apply a chat template."""
        rid = question.id
        try:
            match question:
                case protocol.ApplyTemplate(request=req):
                    return protocol.Prompt(rid, self.render(req))
                case protocol.Tokenize(request=req, with_pieces=with_pieces):
                    tokens = self.tokens(req, req.add_special, req.param).tokens
                    pieces = [self.vocab.piece(t).decode("utf-8", "replace") for t in tokens] if with_pieces else None
                    return protocol.Tokens(rid, tokens, pieces)
                case protocol.Detokenize(tokens=tokens):
                    return protocol.Detokenized(rid, self.vocab.detokenize(self.vocab.known_ids(tokens, "tokens")))
        except Refused as r:
            return r.event(rid)
        except Exception as e:  # a bug here must fail one question, not leave it unanswered
            return failure(rid, e)


@functools.lru_cache(maxsize=64)
def tool_grammar(fmt: str, tools_json: str, required: bool, names: tuple[str, ...] | None, parallel: bool,
                 think: str | None) -> tuple[str, tuple[str, ...]]:
    """The GBNF and trigger patterns (none: constrained from the first token) for calls to the
    tools; kept for the next request with the same tools, as an agent sends them every turn.
    Raises ``Refused`` for a schema the converter cannot follow."""
    from . import toolgrammar

    try:
        built = toolgrammar.build(fmt, json.loads(tools_json), required=required, names=names, parallel=parallel,
                                  think=think)
    except Exception as e:  # the converter asserts, raises KeyError, ValueError, RecursionError, ...
        raise Refused(400, f"`tools` holds a parameter schema this server cannot follow: {e}", "tools") from None
    if (problem := grammar_problem(built.gbnf, MAX_MADE_GRAMMAR_CHARS)) is not None:
        raise Refused(400, f"the grammar made from `tools` {problem}", "tools")
    return built.gbnf, built.triggers
