"""The names a model may be pulled by, parsed into what the hub sources need.

Forms accepted:
- Hugging Face, explicit (Ollama's spelling): ``hf.co/ORG/REPO[:QUANT]``,
  ``huggingface.co/ORG/REPO[:QUANT]``, and ``hf.co/ORG/REPO/PATH/FILE.gguf`` (a file in the repo,
  folders allowed);
- Hugging Face, bare: ``ORG/REPO[:QUANT]`` (llama-server's ``-hf``) and ``ORG/REPO/PATH/FILE.gguf``;
- Ollama: ``MODEL[:TAG]`` (``registry.ollama.ai/library``), ``NS/MODEL[:TAG]``
  (``registry.ollama.ai/NS``) and ``HOST[:PORT]/NS/MODEL[:TAG]`` (another registry: a first part
  with a ``.`` or ``:`` in it, or ``localhost``, is a host). The tag defaults to ``latest``.

``parse`` gives the candidates in the order to try them. A two-part ``A/B[:T]`` means either a
Hugging Face repo or an Ollama model in namespace ``A``, so both come back: the Hugging Face one
first when the name looks like a repo (upper-case letters, ``gguf`` in ``B``, or a ``T`` that reads
as a quantization), the Ollama one first otherwise. Every other form gives one candidate.

These names become paths on disk (Ollama's ``manifests/HOST/NS/MODEL/TAG``, the Hugging Face cache's
``models--ORG--REPO`` and files in its snapshots) and URLs, so this parser is their guard: a name
passes only when each part keeps to the characters and lengths its hub allows (Hugging Face's
``validate_repo_id``, Ollama's ``ParseName``), which leaves no room for a separator, a ``.``/``..``
part, a control character or a scheme. Anything else is a ``BadName`` whose message says what to
fix, for a 400. The name classes also check themselves when built, so a name made elsewhere is held
to the same rules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..models.discovery import HF_HOSTS, OLLAMA_DEFAULT_REGISTRY

MAX_NAME = 512  # the whole name: far above any real one, small enough to quote back in an error

# discovery's own (Ollama's default registry and namespace; HF_HOSTS, Hugging Face's hosts in a name),
# so that a pulled model answers to the name it was pulled by
OLLAMA_REGISTRY, OLLAMA_NAMESPACE = OLLAMA_DEFAULT_REGISTRY
OLLAMA_TAG = "latest"

# Hugging Face (huggingface_hub.utils.validate_repo_id): letters, digits, "_", "-", "."; at most 96;
# "-" and "." neither first nor last; "--" and ".." nowhere (the cache folder joins ORG and REPO with "--")
_REPO_PART = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?")
_FILE_PART = re.compile(r"[A-Za-z0-9_.+-]{1,255}")
_QUANT = re.compile(r"[A-Za-z0-9_-]{1,32}")
# Ollama (types/model/name.go): parts start with a letter, digit or "_"; namespaces take no ".";
# a host is a DNS-like name with an optional port
_OLLAMA_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}")
_OLLAMA_NAMESPACE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,79}")
_HOST = re.compile(r"(?P<name>[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?)(?::(?P<port>[0-9]{1,5}))?")

# What reads as a quantization in a tag, for the order of a two-part name's candidates (case-insensitive):
# llama.cpp's types (Q4_K_M, IQ2_XXS, Q4_0_4_4, TQ1_0, ...), float types, and Unsloth's "UD-" variants.
LOOKS_LIKE_QUANT = re.compile(
    r"(?:UD-)?(?:I?Q[1-8](?:_[A-Z0-9]{1,3})*|TQ[12]_[0-9]|B?F(?:16|32|64)|F8(?:_E4M3|_E5M2)?|MXFP4(?:_MOE)?|NVFP4)",
    re.IGNORECASE)

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


class BadName(ValueError):
    """A name that cannot be pulled; the message says what is wrong with it, for a 400."""


def repo_part_problem(part: str) -> str | None:
    """What is wrong with one half of a Hugging Face ``ORG/REPO``, or None."""
    if not _REPO_PART.fullmatch(part):
        return (f"{part!r} is not a Hugging Face name: at most 96 of letters, digits, '_', '-' and '.', "
                "not starting or ending with '-' or '.'")
    if "--" in part or ".." in part:
        return f"{part!r} is not a Hugging Face name: '--' and '..' are not allowed"
    return None


def file_path_problem(path: str) -> str | None:
    """What is wrong with a path in a Hugging Face repo as a file to fetch, or None.

    Parts of letters, digits, ``_.+-`` only, none ``.`` or ``..``, none empty: such a path stays
    inside the snapshot folder it is joined to, whoever wrote it (a name or the hub's listing)."""
    if not path or len(path) > MAX_NAME:
        return f"a path in the repo must be 1 to {MAX_NAME} characters"
    for part in path.split("/"):
        if not _FILE_PART.fullmatch(part) or part in (".", ".."):
            return (f"{path!r}: each part of a path in the repo must be 1 to 255 of letters, digits, "
                    "'_', '.', '+' and '-', and not '.' or '..'")
    return None


def host_problem(host: str) -> str | None:
    """What is wrong with a registry's ``HOST[:PORT]``, or None."""
    m = _HOST.fullmatch(host)
    if not m or ".." in host:
        return f"{host!r} is not a registry host: letters, digits, '-' and '.' with an optional ':PORT'"
    if m.group("port") is not None and not 1 <= int(m.group("port")) <= 65535:
        return f"{host!r}: the port must be 1 to 65535"
    return None


def _is_host(part: str) -> bool:
    return "." in part or ":" in part or part.lower() == "localhost"


@dataclass(frozen=True)
class HFName:
    """A Hugging Face repo, with the quantization or the file meant in it."""

    repo: str  # "org/repo", case as written (the hub's URLs are case-sensitive)
    quant: str | None  # as written, e.g. "Q4_K_M" or "q8_0"; None: the default rule (hub.choose)
    file: str | None  # a path in the repo ending .gguf, when the name gives one
    explicit: bool  # written with hf.co/ or huggingface.co/

    def __post_init__(self) -> None:
        parts = self.repo.split("/")
        if len(parts) != 2:
            raise BadName(f"{self.repo!r} is not a Hugging Face repo: expected ORG/REPO")
        for part in parts:
            if problem := repo_part_problem(part):
                raise BadName(problem)
        if self.quant is not None and self.file is not None:
            raise BadName("a name gives a quantization or a file, not both")
        if self.quant is not None and not _QUANT.fullmatch(self.quant):
            raise BadName(f"{self.quant!r} is not a quantization: at most 32 of letters, digits, '_' and '-'")
        if self.file is not None:
            if problem := file_path_problem(self.file):
                raise BadName(problem)
            if not self.file.endswith(".gguf"):
                raise BadName(f"{self.file!r}: a file named in a Hugging Face repo must end in .gguf")

    @property
    def canonical(self) -> str:
        """``hf.co/org/repo:QUANT`` (quant upper-cased), ``hf.co/org/repo``, or ``hf.co/org/repo/path/file.gguf``."""
        if self.file is not None:
            return f"hf.co/{self.repo}/{self.file}"
        if self.quant is not None:
            return f"hf.co/{self.repo}:{self.quant.upper()}"
        return f"hf.co/{self.repo}"


@dataclass(frozen=True)
class OllamaName:
    """A model on an Ollama registry. ``parse`` lower-cases the parts: Ollama's names are
    case-insensitive, and its store and discovery use them lower-cased."""

    host: str  # "registry.ollama.ai" or "127.0.0.1:5000"
    namespace: str  # "library" by default
    model: str
    tag: str  # "latest" by default
    explicit: bool  # written with a host

    def __post_init__(self) -> None:
        if problem := host_problem(self.host):
            raise BadName(problem)
        if not _OLLAMA_NAMESPACE.fullmatch(self.namespace):
            raise BadName(f"{self.namespace!r} is not an Ollama namespace: at most 80 of letters, digits, "
                          "'_' and '-', starting with a letter, digit or '_'")
        for kind, part in (("model", self.model), ("tag", self.tag)):
            if not _OLLAMA_PART.fullmatch(part):
                raise BadName(f"{part!r} is not an Ollama {kind}: at most 80 of letters, digits, '_', '-' and '.', "
                              "starting with a letter, digit or '_'")

    @property
    def canonical(self) -> str:
        """``model:tag`` on Ollama's library, ``ns/model:tag`` elsewhere on its registry,
        ``host/ns/model:tag`` on another registry; lower-cased, as discovery names it."""
        host, ns, model, tag = self.store_parts
        if host == OLLAMA_REGISTRY:
            return f"{model}:{tag}" if ns == OLLAMA_NAMESPACE else f"{ns}/{model}:{tag}"
        return f"{host}/{ns}/{model}:{tag}"

    @property
    def store_parts(self) -> tuple[str, str, str, str]:
        """(host, namespace, model, tag): the path under the manifests folder of Ollama, lower-cased
        as Ollama writes it."""
        return self.host.lower(), self.namespace.lower(), self.model.lower(), self.tag.lower()


HubName = HFName | OllamaName


def _ollama(host: str, namespace: str, model: str, tag: str | None, explicit: bool) -> OllamaName:
    return OllamaName(host.lower(), namespace.lower(), model.lower(), (tag or OLLAMA_TAG).lower(), explicit)


def _split_tag(last: str) -> tuple[str, str | None]:
    """The last part of a name into (part, tag or None); an empty or second tag is refused."""
    if ":" not in last:
        return last, None
    head, _, tag = last.partition(":")
    if not head or not tag or ":" in tag:
        raise BadName(f"{last!r}: write one ':TAG' after the name, with nothing empty around it")
    return head, tag


def looks_like_repo(org: str, repo: str, tag: str | None) -> bool:
    """Whether a two-part ``org/repo[:tag]`` reads as a Hugging Face repo first: Ollama names are
    written lower-case and have no GGUF repos, while Hugging Face repos usually do."""
    return (any(c.isupper() for c in org + repo) or "gguf" in repo.lower()
            or (tag is not None and LOOKS_LIKE_QUANT.fullmatch(tag) is not None))


def _check_text(name: str) -> None:
    if not isinstance(name, str):
        raise BadName("a model name must be a string")
    if not name:
        raise BadName("the model name is empty")
    if len(name) > MAX_NAME:
        raise BadName(f"the model name is longer than {MAX_NAME} characters")
    if "\x00" in name:
        raise BadName("the model name holds a NUL character")
    if "\\" in name:
        raise BadName("the model name holds a backslash: parts are separated by '/'")
    if any(c.isspace() for c in name):
        raise BadName("the model name holds white space")
    if _SCHEME.match(name) or "://" in name:
        raise BadName("write the model name without a scheme: hf.co/ORG/REPO, not https://hf.co/ORG/REPO")
    if not name.isascii() or not name.isprintable():
        raise BadName("the model name holds characters other than printable ASCII")
    if name.startswith("/"):
        raise BadName("the model name starts with '/'")
    if "" in name.split("/"):
        raise BadName("the model name has an empty part ('//' or a trailing '/')")


def parse(name: str) -> tuple[HubName, ...]:
    """The candidates ``name`` stands for, in the order to try them; raises ``BadName``."""
    _check_text(name)
    parts = name.split("/")
    *head, last = parts
    if parts[0].lower() in HF_HOSTS:
        if len(parts) < 3:
            raise BadName(f"{name!r}: write {parts[0]}/ORG/REPO[:QUANT] or {parts[0]}/ORG/REPO/FILE.gguf")
        return (_hf(parts[1:], name, explicit=True),)
    if len(parts) >= 3 and _is_host(parts[0]):
        if len(parts) > 3:
            raise BadName(f"{name!r}: a name on another registry is HOST/NAMESPACE/MODEL[:TAG]")
        model, tag = _split_tag(last)
        return (_ollama(parts[0], parts[1], model, tag, explicit=True),)
    if len(parts) >= 3:
        return (_hf(parts, name, explicit=False),)
    if len(parts) == 1:
        model, tag = _split_tag(last)
        if model.lower() in HF_HOSTS:
            raise BadName(f"{name!r}: write {model}/ORG/REPO[:QUANT]")
        return (_ollama(OLLAMA_REGISTRY, OLLAMA_NAMESPACE, model, tag, explicit=False),)
    return _two_parts(head[0], last, name)


def _hf(parts: list[str], name: str, explicit: bool) -> HFName:
    """``ORG/REPO[:QUANT]`` or ``ORG/REPO/PATH/FILE.gguf``, the host already taken off."""
    if len(parts) == 2:
        repo, quant = _split_tag(parts[1])
        return HFName(f"{parts[0]}/{repo}", quant, None, explicit)
    if ":" in parts[-1]:
        raise BadName(f"{name!r}: a name with a file in the repo takes no ':QUANT'")
    if not parts[-1].endswith(".gguf"):
        raise BadName(f"{name!r}: a name of three or more parts is HOST/NAMESPACE/MODEL (a host has a '.' or ':') "
                      "or ORG/REPO/PATH/FILE.gguf")
    return HFName(f"{parts[0]}/{parts[1]}", None, "/".join(parts[2:]), explicit)


def _two_parts(first: str, last: str, name: str) -> tuple[HubName, ...]:
    model, tag = _split_tag(last)
    found: list[HubName] = []
    problems: list[str] = []
    for make in (lambda: HFName(f"{first}/{model}", tag, None, False),
                 lambda: _ollama(OLLAMA_REGISTRY, first, model, tag, False)):
        try:
            found.append(make())
        except BadName as e:
            problems.append(str(e))
    if not found:
        raise BadName(f"{name!r} is neither a Hugging Face repo ({problems[0]}) nor an Ollama name ({problems[1]})")
    hf_first = looks_like_repo(first, model, tag)
    return tuple(sorted(found, key=lambda c: isinstance(c, HFName) != hf_first))
