"""Pull names (gateway.hub.names) and the files of a Hugging Face repo they mean (gateway.hub.choose)."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.hub.choose import Ambiguous, Incomplete, NoMatch, RepoFile, choose, quants
from gateway.hub.names import BadName, HFName, OllamaName, parse


def hf(repo, quant=None, file=None, explicit=False):
    return HFName(repo, quant, file, explicit)


def ol(model, tag="latest", ns="library", host="registry.ollama.ai", explicit=False):
    return OllamaName(host, ns, model, tag, explicit)


# ---------------------------------------------------------------- names: the forms

@pytest.mark.parametrize("name, expected", [
    # Ollama, one part: the library
    ("llama3", (ol("llama3"),)),
    ("llama3.2:3b", (ol("llama3.2", "3b"),)),
    ("Llama3.2:3B-Instruct-Q4_K_M", (ol("llama3.2", "3b-instruct-q4_k_m"),)),  # Ollama's names are case-insensitive
    ("qwen2.5-coder:1.5b", (ol("qwen2.5-coder", "1.5b"),)),
    # Ollama, on another registry (a first part with '.' or ':', or localhost)
    ("registry.ollama.ai/library/llama3", (ol("llama3", explicit=True),)),
    ("registry.ollama.ai/jmorgan/m:t", (ol("m", "t", ns="jmorgan", explicit=True),)),
    ("127.0.0.1:5000/ns/model:v1", (ol("model", "v1", ns="ns", host="127.0.0.1:5000", explicit=True),)),
    ("localhost/ns/model", (ol("model", ns="ns", host="localhost", explicit=True),)),
    ("Example.COM/NS/Model", (ol("model", ns="ns", host="example.com", explicit=True),)),
    ("my.registry/org/file.gguf", (ol("file.gguf", ns="org", host="my.registry", explicit=True),)),  # a host first: Ollama
    # Hugging Face, explicit
    ("hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF", (hf("bartowski/Llama-3.2-1B-Instruct-GGUF", explicit=True),)),
    ("hf.co/unsloth/gemma-3-4b-it-GGUF:q4_k_m", (hf("unsloth/gemma-3-4b-it-GGUF", "q4_k_m", explicit=True),)),
    ("huggingface.co/org/repo:UD-Q4_K_XL", (hf("org/repo", "UD-Q4_K_XL", explicit=True),)),
    ("HF.CO/org/repo", (hf("org/repo", explicit=True),)),
    ("hf.co/org/repo/model-Q8_0.gguf", (hf("org/repo", file="model-Q8_0.gguf", explicit=True),)),
    ("hf.co/org/repo/Q4_K_M/sub/m-Q4_K_M-00001-of-00002.gguf",
     (hf("org/repo", file="Q4_K_M/sub/m-Q4_K_M-00001-of-00002.gguf", explicit=True),)),
    # Hugging Face, a file path without the host
    ("org/repo/model.gguf", (hf("org/repo", file="model.gguf"),)),
    ("org/repo/a/b/c+d.gguf", (hf("org/repo", file="a/b/c+d.gguf"),)),
])
def test_name_forms(name, expected):
    assert parse(name) == expected


@pytest.mark.parametrize("name, first, second", [
    # looks like a repo: upper case, "gguf" in the repo, or a quant tag -> Hugging Face first
    ("bartowski/Llama-3.2-3B-Instruct-GGUF", hf("bartowski/Llama-3.2-3B-Instruct-GGUF"), ol("llama-3.2-3b-instruct-gguf", ns="bartowski")),
    ("Org/model", hf("Org/model"), ol("model", ns="org")),
    ("org/model-gguf", hf("org/model-gguf"), ol("model-gguf", ns="org")),
    ("org/model:Q4_K_M", hf("org/model", "Q4_K_M"), ol("model", "q4_k_m", ns="org")),
    ("org/model:q8_0", hf("org/model", "q8_0"), ol("model", "q8_0", ns="org")),
    ("org/model:iq4_xs", hf("org/model", "iq4_xs"), ol("model", "iq4_xs", ns="org")),
    ("org/model:bf16", hf("org/model", "bf16"), ol("model", "bf16", ns="org")),
    ("org/model:mxfp4", hf("org/model", "mxfp4"), ol("model", "mxfp4", ns="org")),
    ("org/model:TQ1_0", hf("org/model", "TQ1_0"), ol("model", "tq1_0", ns="org")),
    ("org/model:ud-q4_k_xl", hf("org/model", "ud-q4_k_xl"), ol("model", "ud-q4_k_xl", ns="org")),
    # reads as Ollama's: Ollama first
    ("jmorgan/model", ol("model", ns="jmorgan"), hf("jmorgan/model")),
    ("library/llama3:8b", ol("llama3", "8b"), hf("library/llama3", "8b")),
    ("org/model:7b-instruct-q4_K_M", ol("model", "7b-instruct-q4_k_m", ns="org"), hf("org/model", "7b-instruct-q4_K_M")),
])
def test_two_part_names_give_both_in_order(name, first, second):
    assert parse(name) == (first, second)


@pytest.mark.parametrize("name, only", [
    ("org/model:3.2", ol("model", "3.2", ns="org")),  # '.' is no quant: Ollama only
    ("org.dot/Model", hf("org.dot/Model")),  # Ollama namespaces take no '.': Hugging Face only
    ("org/model.", ol("model.", ns="org")),  # a repo does not end with '.'
    ("org/-model", None),  # neither
])
def test_two_part_names_valid_for_one_hub(name, only):
    if only is None:
        with pytest.raises(BadName, match="neither"):
            parse(name)
    else:
        assert parse(name) == (only,)


@pytest.mark.parametrize("name, canonical", [
    ("llama3", "llama3:latest"),
    ("registry.ollama.ai/library/Llama3:8B", "llama3:8b"),
    ("registry.ollama.ai/jmorgan/m", "jmorgan/m:latest"),
    ("127.0.0.1:5000/NS/M:T", "127.0.0.1:5000/ns/m:t"),
    ("hf.co/Org/Repo:q4_k_m", "hf.co/Org/Repo:Q4_K_M"),
    ("huggingface.co/Org/Repo", "hf.co/Org/Repo"),
    ("Org/Repo/dir/Model-Q8_0.gguf", "hf.co/Org/Repo/dir/Model-Q8_0.gguf"),
])
def test_canonical(name, canonical):
    assert parse(name)[0].canonical == canonical


def test_store_parts_are_ollamas_manifest_path():
    assert parse("Example.com:5000/NS/Model:TAG")[0].store_parts == ("example.com:5000", "ns", "model", "tag")
    assert parse("llama3")[0].store_parts == ("registry.ollama.ai", "library", "llama3", "latest")


# ---------------------------------------------------------------- names: refusals

@pytest.mark.parametrize("name, reason", [
    ("", "empty"),
    ("x" * 513, "longer than 512"),
    ("https://hf.co/org/repo", "without a scheme"),
    ("hf://org/repo", "without a scheme"),
    ("org/repo://x", "without a scheme"),
    ("/org/repo", "starts with '/'"),
    ("org//repo", "empty part"),
    ("org/repo/", "empty part"),
    ("org\\repo", "backslash"),
    ("..\\x", "backslash"),
    ("llama3\x00", "NUL"),
    ("llama 3", "white space"),
    ("llama3\n", "white space"),
    ("lläma", "ASCII"),
    ("llama3\x7f", "ASCII"),
    # path traversal
    ("../x", "neither"),
    ("..", "Ollama model"),
    ("a/../b", "three or more parts"),
    ("a/../b.gguf", "not a Hugging Face name"),
    ("org/repo/../x.gguf", "not '.' or '..'"),
    ("org/repo/./x.gguf", "not '.' or '..'"),
    ("hf.co/a/b/../../x.gguf", "not '.' or '..'"),
    ("hf.co/../b", "not a Hugging Face name"),
    ("localhost/../m", "Ollama namespace"),
    ("localhost/ns/..", "Ollama model"),
    ("llama3:..", "Ollama tag"),
    # the Hugging Face rules
    ("hf.co/org", "hf.co/ORG/REPO"),
    ("hf.co", "hf.co/ORG/REPO"),
    ("hf.co/org/re--po", "'--'"),
    ("hf.co/org/re..po", "'..'"),
    ("hf.co/org/-repo", "not starting or ending"),
    ("hf.co/org/repo.", "not starting or ending"),
    ("hf.co/org/" + "r" * 97, "at most 96"),
    ("hf.co/org/repo:Q4.K", "not a quantization"),
    ("hf.co/org/repo:" + "Q" * 33, "not a quantization"),
    ("hf.co/org/repo:", "one ':TAG'"),
    ("hf.co/org/repo:a:b", "one ':TAG'"),
    ("hf.co/org/repo/model.bin", "FILE.gguf"),
    ("org/repo/model.GGUF", "FILE.gguf"),
    ("org/repo/model.gguf:Q4_K_M", "takes no ':QUANT'"),
    ("org/repo/" + "f" * 256 + ".gguf", "1 to 255"),
    ("org/repo/a b.gguf", "white space"),
    ("org/repo/f%2e.gguf", "1 to 255"),
    # the Ollama rules
    (":latest", "one ':TAG'"),
    ("llama3:", "one ':TAG'"),
    ("-llama", "Ollama model"),
    ("llama3:-x", "Ollama tag"),
    ("llama3:" + "t" * 81, "Ollama tag"),
    ("m" * 81, "Ollama model"),
    ("m@sha256:abc", "Ollama model"),
    ("localhost:0/ns/m", "port must be"),
    ("localhost:65536/ns/m", "port must be"),
    ("host:99999999/ns/m", "registry host"),
    ("a..b/ns/m", "registry host"),
    ("-h.com/ns/m", "registry host"),
    ("h.com/ns/m/x", "HOST/NAMESPACE/MODEL"),
    ("h.com/n.s/m", "Ollama namespace"),
])
def test_refused(name, reason):
    with pytest.raises(BadName, match=re.escape(reason)):
        parse(name)


def test_name_classes_check_themselves():
    with pytest.raises(BadName):
        HFName("org/../x", None, None, False)
    with pytest.raises(BadName):
        HFName("org/repo", None, "../x.gguf", False)
    with pytest.raises(BadName):
        HFName("org/repo", "Q4_K_M", "x.gguf", False)
    with pytest.raises(BadName):
        OllamaName("registry.ollama.ai", "..", "m", "latest", False)
    assert parse("x" * 80)[0].model == "x" * 80
    assert len(parse("hf.co/o/r/" + "d/" * 240 + "f.gguf")[0].file) < 512


def _parts(c):
    if isinstance(c, HFName):
        return [*c.repo.split("/"), c.quant or "q", *(c.file.split("/") if c.file else [])]
    return [c.host, c.namespace, c.model, c.tag]


@settings(max_examples=2000, deadline=None)
@given(st.one_of(
    st.text(max_size=80),
    st.text(alphabet="abAB09_.-:/\\\x00 %+@", max_size=40),
    st.lists(st.sampled_from(["hf.co", "a", "A", "..", ".", "x.gguf", "localhost:1", "q4_k_m", "", ":", "b-c", "gguf"]),
             max_size=6).map("/".join),
))
def test_parse_is_a_guard(name):
    try:
        found = parse(name)
    except BadName:
        return
    assert 1 <= len(found) <= 2
    for c in found:
        for part in _parts(c):
            assert part and "/" not in part and "\\" not in part and "\x00" not in part and part not in (".", "..")
        assert c.canonical.isascii() and not any(ch.isspace() for ch in c.canonical)
        if isinstance(c, OllamaName):
            assert all("/" not in p and p not in (".", "..") for p in c.store_parts)


# ---------------------------------------------------------------- choose

def files(*paths):
    return [RepoFile(p, 1, None) for p in paths]


def paths(choice):
    return [f.path for f in choice.files], (choice.projector.path if choice.projector else None), choice.quant


QUANTS = files("README.md", "m-Q2_K.gguf", "m-Q4_K_M.gguf", "m-Q8_0.gguf", "m-IQ4_XS.gguf", "m-F16.gguf", "mmproj-m-F16.gguf")


@pytest.mark.parametrize("listing, quant, expected", [
    # the default: Q4_K_M, then Q8_0, then the one model there is
    (QUANTS, None, (["m-Q4_K_M.gguf"], "mmproj-m-F16.gguf", "Q4_K_M")),
    (files("m-Q8_0.gguf", "m-Q2_K.gguf"), None, (["m-Q8_0.gguf"], None, "Q8_0")),
    (files("m-q8_0.gguf", "m-Q2_K.gguf"), None, (["m-q8_0.gguf"], None, "Q8_0")),
    (files("only-BF16.gguf", "mmproj.gguf"), None, (["only-BF16.gguf"], "mmproj.gguf", "BF16")),
    (files("model.gguf"), None, (["model.gguf"], None, "model")),
    # a quant, case-insensitive, upper-cased in the answer
    (QUANTS, "q8_0", (["m-Q8_0.gguf"], "mmproj-m-F16.gguf", "Q8_0")),
    (QUANTS, "iq4_xs", (["m-IQ4_XS.gguf"], "mmproj-m-F16.gguf", "IQ4_XS")),
    (QUANTS, "F16", (["m-F16.gguf"], "mmproj-m-F16.gguf", "F16")),  # the projector is never the model
    (files("m.Q4_K_M.gguf"), "Q4_K_M", (["m.Q4_K_M.gguf"], None, "Q4_K_M")),  # TheBloke's '.'
    (files("m-UD-Q4_K_XL.gguf", "m-Q4_K_M.gguf"), "ud-q4_k_xl", (["m-UD-Q4_K_XL.gguf"], None, "UD-Q4_K_XL")),
    (files("m-UD-Q4_K_XL.gguf", "m-Q4_K_M.gguf"), "Q4_K_XL", (["m-UD-Q4_K_XL.gguf"], None, "Q4_K_XL")),
    (files("m-IQ4_0.gguf", "m-Q4_0.gguf"), "Q4_0", (["m-Q4_0.gguf"], None, "Q4_0")),  # whole words: not IQ4_0
    (files("m-Q4_K_M.imatrix.gguf", "imatrix.gguf", "m-Q4_K_M.gguf"), None, (["m-Q4_K_M.gguf"], None, "Q4_K_M")),
    # split models: every part, in order, whatever the listing's order
    (files("m-Q8_0-00002-of-00002.gguf", "m-Q4_K_M-00003-of-00003.gguf", "m-Q4_K_M-00001-of-00003.gguf",
           "m-Q4_K_M-00002-of-00003.gguf", "m-Q8_0-00001-of-00002.gguf"), None,
     (["m-Q4_K_M-00001-of-00003.gguf", "m-Q4_K_M-00002-of-00003.gguf", "m-Q4_K_M-00003-of-00003.gguf"], None, "Q4_K_M")),
    (files("Q8_0/m-Q8_0-00001-of-00002.gguf", "Q8_0/m-Q8_0-00002-of-00002.gguf", "mmproj-F16.gguf"), "q8_0",
     (["Q8_0/m-Q8_0-00001-of-00002.gguf", "Q8_0/m-Q8_0-00002-of-00002.gguf"], "mmproj-F16.gguf", "Q8_0")),
    (files("m-Q4_K_M-00001-of-00001.gguf"), None, (["m-Q4_K_M-00001-of-00001.gguf"], None, "Q4_K_M")),
    # projectors: the model's folder first, else the nearest above; mmproj* before the F16 one before the first by name
    (files("a/m-Q4_K_M.gguf", "a/mmproj-Q8_0.gguf", "a/mmproj-F16.gguf", "mmproj-BF16.gguf"), None,
     (["a/m-Q4_K_M.gguf"], "a/mmproj-F16.gguf", "Q4_K_M")),
    (files("a/b/m-Q4_K_M.gguf", "x/mmproj-F16.gguf", "a/mmproj-Q8_0.gguf", "mmproj-F16.gguf"), None,
     (["a/b/m-Q4_K_M.gguf"], "a/mmproj-Q8_0.gguf", "Q4_K_M")),
    (files("a/m-Q4_K_M.gguf", "x/mmproj-F16.gguf", "MMPROJ-f32.gguf"), None, (["a/m-Q4_K_M.gguf"], "MMPROJ-f32.gguf", "Q4_K_M")),
    (files("m-Q4_K_M.gguf", "m-mmproj-q8_0.gguf", "m-mmproj-f16.gguf"), None, (["m-Q4_K_M.gguf"], "m-mmproj-f16.gguf", "Q4_K_M")),
    (files("m-Q4_K_M.gguf", "vision-mmproj-b.gguf", "mmproj-z.gguf"), None, (["m-Q4_K_M.gguf"], "mmproj-z.gguf", "Q4_K_M")),
    (files("m-Q4_K_M.gguf", "z-mmproj.gguf", "b-mmproj.gguf"), None, (["m-Q4_K_M.gguf"], "b-mmproj.gguf", "Q4_K_M")),
    (files("m-Q4_K_M.gguf", "mmproj.bin"), None, (["m-Q4_K_M.gguf"], None, "Q4_K_M")),
    # unsafe entries of a listing are never chosen
    (files("../m-Q4_K_M.gguf", "a b-Q4_K_M.gguf", "m-Q4_K_M.gguf", "../mmproj.gguf"), None, (["m-Q4_K_M.gguf"], None, "Q4_K_M")),
])
def test_choose_by_quant(listing, quant, expected):
    assert paths(choose(listing, quant)) == expected


def test_choose_by_file():
    listing = files("a/m-Q4_K_M.gguf", "b/m-Q4_K_M-00002-of-00002.gguf", "b/m-Q4_K_M-00001-of-00002.gguf", "b/mmproj-F16.gguf")
    assert paths(choose(listing, file="a/m-Q4_K_M.gguf")) == (["a/m-Q4_K_M.gguf"], None, "m-Q4_K_M")
    assert paths(choose(listing, file="b/m-Q4_K_M-00002-of-00002.gguf")) == (
        ["b/m-Q4_K_M-00001-of-00002.gguf", "b/m-Q4_K_M-00002-of-00002.gguf"], "b/mmproj-F16.gguf", "m-Q4_K_M")
    with pytest.raises(NoMatch) as e:
        choose(listing, file="A/m-Q4_K_M.gguf")  # exact, case-sensitive
    assert e.value.choices == ("a/m-Q4_K_M.gguf", "b/m-Q4_K_M-00001-of-00002.gguf")
    with pytest.raises(NoMatch, match="not a model"):
        choose(listing, file="b/mmproj-F16.gguf")
    with pytest.raises(NoMatch, match="no part"):
        choose(files("m-00000-of-00002.gguf"), file="m-00000-of-00002.gguf")
    with pytest.raises(ValueError, match="not both"):
        choose(listing, "Q4_K_M", "a/m-Q4_K_M.gguf")


def test_choose_keeps_the_entries():
    listing = [RepoFile("m-Q4_K_M.gguf", 123, "ab" * 32), RepoFile("m-Q4_K_M.gguf", 9, None)]  # a repeated path: the first
    assert choose(listing).files == (listing[0],)


@pytest.mark.parametrize("listing, quant, choices", [
    (files("a/m-Q4_K_M.gguf", "b/m-Q4_K_M.gguf"), None, ("a/m-Q4_K_M.gguf", "b/m-Q4_K_M.gguf")),
    (files("model-Q4_K_M.gguf", "model-instruct-Q4_K_M.gguf"), "q4_k_m", ("model-Q4_K_M.gguf", "model-instruct-Q4_K_M.gguf")),
    (files("m-Q4_K_M-00001-of-00002.gguf", "m-Q4_K_M-00002-of-00002.gguf", "m-Q4_K_M.gguf"), "Q4_K_M",
     ("m-Q4_K_M-00001-of-00002.gguf", "m-Q4_K_M.gguf")),
    (files("m-Q4_K_M-00001-of-00002.gguf", "m-Q4_K_M-00001-of-00003.gguf"), "Q4_K_M",
     ("m-Q4_K_M-00001-of-00002.gguf", "m-Q4_K_M-00001-of-00003.gguf")),
    # no default, several models: their quants, or their files where quants repeat
    (files("m-Q2_K.gguf", "m-Q6_K.gguf", "mmproj-F16.gguf"), None, ("Q2_K", "Q6_K")),
    (files("a/m-Q2_K.gguf", "b/m-Q2_K.gguf"), None, ("a/m-Q2_K.gguf", "b/m-Q2_K.gguf")),
])
def test_ambiguous_lists_the_choices(listing, quant, choices):
    with pytest.raises(Ambiguous) as e:
        choose(listing, quant)
    assert e.value.choices == choices


def test_no_match_lists_the_quants():
    with pytest.raises(NoMatch) as e:
        choose(QUANTS, "Q5_K_M")
    assert e.value.choices == ("F16", "IQ4_XS", "Q2_K", "Q4_K_M", "Q8_0")
    assert quants(QUANTS) == e.value.choices
    with pytest.raises(NoMatch, match="no GGUF model"):
        choose(files("README.md", "mmproj-F16.gguf", "imatrix.gguf"))
    with pytest.raises(NoMatch):
        choose(QUANTS, "Q4_K")  # not a prefix of Q4_K_M
    assert quants(files("a-Q4_K_M-00001-of-00002.gguf", "a-Q4_K_M-00002-of-00002.gguf", "plain.gguf")) == ("Q4_K_M", "plain")


def test_a_split_model_missing_a_part_is_incomplete():
    listing = files("m-Q4_K_M-00001-of-00003.gguf", "m-Q4_K_M-00003-of-00003.gguf")
    with pytest.raises(Incomplete, match="part 2 of 3"):
        choose(listing)
    with pytest.raises(Incomplete, match="part 1 of 2"):
        choose(files("m-Q8_0-00002-of-00002.gguf"), "Q8_0")


def test_bounds():
    with pytest.raises(ValueError, match="more than the 100000"):
        choose([RepoFile("m.gguf", 1, None)] * 100_001)
    with pytest.raises(ValueError, match="more than the 1024"):
        choose(files("m-Q4_K_M-00001-of-01025.gguf"))
    with pytest.raises(Incomplete):
        choose(files("m-Q4_K_M-00001-of-01024.gguf"))
