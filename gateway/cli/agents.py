"""What ``gguf-gateway launch`` decides, as pure functions: which model a coding agent gets
(``pick``), and what each agent is told so that it talks to the gateway (``settings``).

Nothing here reads the network, the disk or the environment; ``cli/launch`` gathers the facts
(``Model``), writes the files a ``Settings`` names, and runs or prints it.

The settings go to the agent's process only: variables and command-line flags, and where an
agent reads its provider from a file, a file of ours (in the gateway's state folder) that the
agent is pointed at by its own flag. No file the agent owns is touched. A key never goes into
a file: where one is needed, the file names the variable ``KEY_VAR`` in the agent's own syntax,
and the value is ``KEY`` (the key itself when it runs, ``"$GGUF_GATEWAY_KEY"`` when printed).

Each agent's ``min_context``: the context below which its first request does not fit. Codex and
Claude Code send about 20k tokens of instructions and tool definitions before the first word;
opencode about 10k; Continue's CLI about 5k; aider about 2k. ``launch --force`` goes on anyway.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..backends.untrusted import name_problem as _untrusted_name_problem
from ..backends.untrusted import shown

KEY_VAR = "GGUF_GATEWAY_KEY"  # the variable a person's key is read from, and given to the agent in
NO_KEY = "gguf-gateway"  # what an agent that insists on a key gets where the gateway has none


class Key:
    """The person's key, where a setting holds it (``KEY``): the key itself in the agent's
    environment, a reference to ``$GGUF_GATEWAY_KEY`` where printed."""

    def __repr__(self) -> str:
        return "KEY"


KEY = Key()
Value = str | Key


class LaunchError(Exception):
    """One line saying what went wrong and what to do; ``launch`` prints it and exits with
    ``code``."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Model:
    """A model as the gateway describes it: its name, whether its format carries tool calls,
    its context in tokens (None: not known, an upstream's), whether it is loaded now."""
    name: str
    tools: bool
    n_ctx: int | None
    loaded: bool


@dataclass(frozen=True)
class Client:
    name: str  # as ``launch`` names it
    title: str
    program: str  # the executable looked for on PATH
    install: str  # how to install it
    min_context: int  # tokens its first request needs (see the module's docstring)


CLIENTS = {c.name: c for c in (
    Client("claude", "Claude Code", "claude", "npm install -g @anthropic-ai/claude-code", 24000),
    Client("codex", "Codex", "codex", "npm install -g @openai/codex", 24000),
    Client("opencode", "opencode", "opencode", "npm install -g opencode-ai", 12000),
    Client("continue", "Continue CLI", "cn", "npm install -g @continuedev/cli", 8192),
    Client("aider", "aider", "aider", "pipx install aider-chat (or: pip install aider-chat)", 4096),
)}


SUBSTITUTIONS = "${}"  # what an agent's configuration reads as a substitution in a name


def name_problem(name: str) -> str | None:
    """Why the gateway's model ``name`` cannot be passed to an agent, or None where it can. The
    name goes into the agents' own configurations, and some read more there than text:
    opencode replaces ``{env:X}`` and ``{file:PATH}`` (the file's text) in
    ``OPENCODE_CONFIG_CONTENT``, Continue ``${{ secrets.X }}`` in its YAML; a name holding them
    would send the person's other secrets to the gateway as the model's name with each request.
    So a name is refused where another server's would be (``untrusted.name_problem``: a control
    or bidi character, a path that leaves, too long), and where it holds ``$``, ``{`` or ``}``."""
    problem = _untrusted_name_problem(name)
    if problem is None and any(c in SUBSTITUTIONS for c in name):
        problem = "a '$', '{' or '}', which agents' configurations read as a substitution"
    return problem


def pick(models: Sequence[Model], named: str | None, default: str | None) -> tuple[Model, str]:
    """The model to launch an agent on, and why (a phrase): the one ``named``, else the
    configured ``default`` (``server.agent_model``), else among the models whose format carries
    tool calls a loaded one before one that is not, the biggest context first, then by name.
    A named or default model that is not on the gateway, or none with tool calls, is a
    ``LaunchError``; a named or default model without tool calls is picked, and the line says so.
    A name with a ``name_problem`` is never picked: named, it is a ``LaunchError``."""
    by_name = {m.name: m for m in models}
    for wanted, why in ((named, "named with --model"), (default, "server.agent_model in the configuration")):
        if wanted:
            if wanted not in by_name:
                raise LaunchError(f"no model {wanted!r} on the gateway ({why}); see `gguf-gateway models`")
            model = by_name[wanted]
            problem = name_problem(model.name)
            if problem:
                raise LaunchError(f"the gateway's model {shown(model.name, 80)!r} cannot be passed to an agent: "
                                  f"its name holds {problem}")
            caveat = "" if model.tools else "; its format has no tool calls: the agent's tools will not work"
            return model, f"{why}{caveat}"
    callers = [m for m in models if m.tools and name_problem(m.name) is None]
    if not callers:
        raise LaunchError("no model on the gateway has a format with tool calls, which agents need; "
                          "add one to models.yaml (or name one with --model)")
    best = min(callers, key=lambda m: (not m.loaded, -(m.n_ctx or 0), m.name))
    context = f"{best.n_ctx} tokens" if best.n_ctx else "not known"
    which = "loaded model" if best.loaded else "model (none of them is loaded)"
    return best, f"the {which} with tool calls and the biggest context ({context})"


def check_context(client: Client, model: Model) -> None:
    """A ``LaunchError`` where ``model``'s context is known and below what ``client``'s first
    request needs."""
    if model.n_ctx is not None and model.n_ctx < client.min_context:
        raise LaunchError(f"{model.name} has a context of {model.n_ctx} tokens, and {client.title}'s prompt needs "
                          f"about {client.min_context}: give it a larger n_ctx in models.yaml, pick another with "
                          "--model, or go on with --force")


@dataclass
class Settings:
    """What an agent is given: ``env`` set in its environment, ``args``
    before the person's own, ``files`` (a name in our launch folder -> its text) written
    first; ``{dir}`` in ``args`` and in the files' texts is that folder. ``note``: a comment
    for ``--print`` (the same settings as a file, for a shell profile's reader)."""
    env: dict[str, Value] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    note: str = ""


def settings(client: Client, url: str, model: Model, keyed: bool) -> Settings:
    """``client``'s settings for ``model`` on the gateway at ``url`` (its root, no ``/v1``);
    ``keyed``: the gateway asks for a key (``KEY`` stands for it)."""
    return _BUILDERS[client.name](url.rstrip("/"), model, keyed)


def _claude(url: str, model: Model, keyed: bool) -> Settings:
    """Claude Code: every model slot it has (main, small and fast, haiku, sonnet, opus,
    subagents) set to the one model, the key as a bearer token (``ANTHROPIC_AUTH_TOKEN``, which
    it sends without asking to approve it; ``ANTHROPIC_API_KEY`` emptied, which would win),
    auto-compaction at the model's context, nothing sent to anthropic.com, and no billing
    header (``CLAUDE_CODE_ATTRIBUTION_HEADER=0``), which changes every session and would make a
    new session's prompt miss the cache; the gateway also drops it (server.keep_billing_header)."""
    name = model.name
    env: dict[str, Value] = {
        "ANTHROPIC_BASE_URL": url, "ANTHROPIC_AUTH_TOKEN": KEY if keyed else NO_KEY, "ANTHROPIC_API_KEY": "",
        "ANTHROPIC_MODEL": name, "ANTHROPIC_SMALL_FAST_MODEL": name, "ANTHROPIC_DEFAULT_HAIKU_MODEL": name,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": name, "ANTHROPIC_DEFAULT_OPUS_MODEL": name,
        "CLAUDE_CODE_SUBAGENT_MODEL": name, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_ATTRIBUTION_HEADER": "0"}
    if model.n_ctx:
        env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] = str(model.n_ctx)
    return Settings(env=env)


CODEX_PROVIDER = "gguf-gateway"


def _toml(value: str | int) -> str:
    """A TOML value: a JSON string is a TOML basic string, but for the characters JSON escapes
    as UTF-16 surrogate pairs (TOML reads ``\\ud83d`` as an error: Codex would then take the text
    with its quotes for the model's name), so those stay as they are, and DEL, which TOML wants
    escaped and JSON does not."""
    if isinstance(value, int):
        return str(value)
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def _codex(url: str, model: Model, keyed: bool) -> Settings:
    """Codex: a provider of its own (its built-in ``openai`` provider cannot be pointed
    elsewhere: ``OPENAI_BASE_URL`` is not read and ``[model_providers.openai]`` is a reserved
    ID), over the Responses API, with the model's context, as ``-c`` overrides; the key by
    ``env_key``, which Codex sends as a bearer token."""
    provider = f"model_providers.{CODEX_PROVIDER}"
    table: dict[str, str | int] = {"model_provider": CODEX_PROVIDER, f"{provider}.name": "gguf-gateway",
                                   f"{provider}.base_url": f"{url}/v1", f"{provider}.wire_api": "responses"}
    if keyed:
        table[f"{provider}.env_key"] = KEY_VAR
    table["model"] = model.name
    if model.n_ctx:
        table["model_context_window"] = model.n_ctx
    args = [a for k, v in table.items() for a in ("-c", f"{k}={_toml(v)}")]
    top = {k: v for k, v in table.items() if not k.startswith(provider)}
    block = "".join(f"{k} = {_toml(v)}\n" for k, v in top.items()) + f"\n[{provider}]\n" + "".join(
        f"{k.removeprefix(provider + '.')} = {_toml(v)}\n" for k, v in table.items() if k.startswith(provider))
    return Settings(env={KEY_VAR: KEY} if keyed else {}, args=args,
                    note="or the same in $CODEX_HOME/config.toml (~/.codex/config.toml):\n" + block)


def _opencode(url: str, model: Model, keyed: bool) -> Settings:
    """opencode: the gateway as an OpenAI-compatible provider in ``OPENCODE_CONFIG_CONTENT``
    (merged over the person's own configuration), the model's context as its limit, the key
    as ``{env:GGUF_GATEWAY_KEY}``, which opencode reads from its environment."""
    entry: dict = {"name": model.name}
    if model.n_ctx:
        entry["limit"] = {"context": model.n_ctx, "output": min(8192, model.n_ctx // 4)}
    options = {"baseURL": f"{url}/v1", "apiKey": f"{{env:{KEY_VAR}}}" if keyed else NO_KEY}
    config = {"$schema": "https://opencode.ai/config.json",
              "provider": {"gguf-gateway": {"npm": "@ai-sdk/openai-compatible", "name": "gguf-gateway",
                                            "options": options, "models": {model.name: entry}}},
              "model": f"gguf-gateway/{model.name}", "small_model": f"gguf-gateway/{model.name}"}
    env: dict[str, Value] = {"OPENCODE_CONFIG_CONTENT": json.dumps(config, separators=(",", ":"))}
    if keyed:
        env[KEY_VAR] = KEY
    return Settings(env=env)


def _file_name(model: Model, suffix: str) -> str:
    """A file of ours for ``model``: its name kept to letters, digits, ``.``, ``-`` and ``_``."""
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in model.name) + suffix


def _continue(url: str, model: Model, keyed: bool) -> Settings:
    """Continue's CLI: a config.yaml of ours (``--config``), the model's context as its
    ``contextLength``, the key as ``${{ secrets.GGUF_GATEWAY_KEY }}``, which Continue reads from
    its environment for a local configuration."""
    options = f"    defaultCompletionOptions:\n      contextLength: {model.n_ctx}\n" if model.n_ctx else ""
    key = f"${{{{ secrets.{KEY_VAR} }}}}" if keyed else NO_KEY
    text = (f"name: gguf-gateway\nversion: 1.0.0\nschema: v1\nmodels:\n  - name: {json.dumps(model.name)}\n"
            f"    provider: openai\n    model: {json.dumps(model.name)}\n    apiBase: {json.dumps(url + '/v1')}\n"
            f"    apiKey: {json.dumps(key)}\n    roles: [chat, edit, apply]\n{options}")
    name = _file_name(model, ".continue.yaml")
    return Settings(env={KEY_VAR: KEY} if keyed else {}, args=["--config", f"{{dir}}/{name}"], files={name: text})


def _aider(url: str, model: Model, keyed: bool) -> Settings:
    """aider: OpenAI's shape (``OPENAI_API_BASE``, ``OPENAI_API_KEY``, ``--model openai/NAME``),
    and a model-metadata file of ours (``--model-metadata-file``) with the model's context, so
    that aider knows it (and warns of no unknown model)."""
    qualified = f"openai/{model.name}"
    args = ["--model", qualified]
    files = {}
    if model.n_ctx:
        name = _file_name(model, ".aider-metadata.json")
        files[name] = json.dumps({qualified: {
            "max_input_tokens": model.n_ctx, "max_tokens": model.n_ctx,
            "max_output_tokens": min(8192, model.n_ctx // 4),
            "input_cost_per_token": 0, "output_cost_per_token": 0, "litellm_provider": "openai", "mode": "chat",
            "supports_function_calling": model.tools}}, indent=2) + "\n"
        args += ["--model-metadata-file", f"{{dir}}/{name}"]
    return Settings(env={"OPENAI_API_BASE": f"{url}/v1", "OPENAI_API_KEY": KEY if keyed else NO_KEY},
                    args=args, files=files)


_BUILDERS = {"claude": _claude, "codex": _codex, "opencode": _opencode, "continue": _continue, "aider": _aider}
