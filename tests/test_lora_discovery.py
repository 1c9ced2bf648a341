"""LoRA adapters found beside discovered models (``models/adapterpairing.py``): an adapter goes with the
models of its folder, or of the folder above its ``loras/`` or ``adapters/`` folder, that llama.cpp
would load it onto (the architecture, and each adapted tensor's shape), read from headers alone."""

import json
import logging
import os
from pathlib import Path

import gguf
import numpy as np
import pytest
from helpers import run_cli

from gateway.models import adapterpairing, discovery
from gateway.models import testmodels as tm
from gateway.models.adapterpairing import fit_problem, lora_pairs
from gateway.models.catalog import ModelCatalog
from gateway.models.config import AdapterSpec, load_config
from gateway.models.ggufmeta import GGUFInfo, ModelFileError, read_info, tensor_shapes
from gateway.models.ggufwriter import finish
from gateway.serving.registry import Registry


def write_adapter(path: Path, tensors: dict[str, np.ndarray], *, arch: str = "llama", adapter_type: str = "lora",
                  kind: str = "adapter") -> Path:
    """An adapter GGUF of the given tensors (numpy's shapes: ggml's reversed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_string("general.type", kind)
    w.add_string("adapter.type", adapter_type)
    w.add_float32("adapter.lora.alpha", 1.0)
    for name, t in tensors.items():
        w.add_tensor(name, t)
    finish(w)
    return path


def folder(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def dims(model: Path) -> tuple[int, int, int]:
    """A scripted model's (n_embd, n_ff, n_vocab)."""
    info = read_info(model)
    return info.embedding_length, int(info.shape["feed_forward_length"]), info.n_vocab


def pair_for(name: str, n_in: int, n_out: int, rank: int = 2) -> dict[str, np.ndarray]:
    """``name``'s lora_a (ne [n_in, rank]) and lora_b (ne [rank, n_out])."""
    return {f"{name}.lora_a": np.zeros((rank, n_in), np.float32), f"{name}.lora_b": np.zeros((n_out, rank), np.float32)}


def catalog(write_config, *dirs: Path) -> ModelCatalog:
    return ModelCatalog(load_config(write_config(
        f"server:\n  models_dirs: [{', '.join(map(str, dirs))}]\n  discover_default_stores: false\n")))


def picked(cat: ModelCatalog, name: str):
    """What a request for ``name`` runs, as the gateway reads it (``Registry.adapters.picked``)."""
    return Registry(cat.config).adapters.picked(name)


def adapters_of(cat: ModelCatalog, name: str) -> dict[str, Path]:
    spec = cat.resolve(name)
    assert spec is not None, name
    return {a.name: a.path for a in spec.loras}


def test_adapters_beside_a_model_and_in_its_loras_and_adapters_folders_pair_with_it(write_config, tmp_path):
    d = folder(tmp_path / "models")
    for sub in ("loras/deeper", "adapters", "styles"):
        (d / sub).mkdir(parents=True)
    model = tm.plain(d / "chat.gguf").path
    here = tm.lora_adapter(model, d / "Pirate Talk.gguf")
    loras = tm.lora_adapter(model, d / "loras" / "concise.gguf")
    adapters = tm.lora_adapter(model, d / "adapters" / "formal.gguf")
    tm.lora_adapter(model, d / "styles" / "elsewhere.gguf")  # no adapters' folder name: its own folder only
    tm.lora_adapter(model, d / "loras" / "deeper" / "too-deep.gguf")  # one level down only
    cat = catalog(write_config, d)
    spec = cat.resolve("chat")
    assert spec.loras == (AdapterSpec("pirate-talk", here, 1.0, "discovered"),  # its own folder's first, then by path
                          AdapterSpec("formal", adapters, 1.0, "discovered"),
                          AdapterSpec("concise", loras, 1.0, "discovered"))
    # no adapter is a model of its own
    assert all(cat.resolve(n) is None for n in ("pirate talk", "pirate-talk", "concise", "formal", "elsewhere"))
    assert picked(cat, "chat:pirate-talk") == (spec, "pirate-talk") and picked(cat, "concise") == (spec, "concise")


def test_an_adapter_goes_only_with_the_models_its_shapes_fit(write_config, tmp_path):
    d = folder(tmp_path / "models")
    small = tm.plain(d / "small.gguf").path
    tm.plain(d / "large.gguf", ["x"] * 200)  # a larger vocabulary: another output head
    (d / "twin.gguf").write_bytes(small.read_bytes())  # the same model in another file
    tm.lora_adapter(small, d / "ends.gguf")
    cat = catalog(write_config, d)
    assert list(adapters_of(cat, "small")) == ["ends"] and list(adapters_of(cat, "twin")) == ["ends"]
    assert adapters_of(cat, "large") == {}
    assert picked(cat, "ends") is None  # two models have it: ambiguous
    assert picked(cat, "small:ends")[0] == cat.resolve("small")


@pytest.mark.parametrize(("tensors", "why"), [
    (lambda e, f, v: pair_for("output.weight", e + 1, v), "does not fit"),  # lora_a's input
    (lambda e, f, v: pair_for("output.weight", e, v + 1), "does not fit"),  # lora_b's output
    (lambda e, f, v: {"output.weight.lora_a": np.zeros((2, e), np.float32),
                      "output.weight.lora_b": np.zeros((v, 3), np.float32)}, "does not fit"),  # the ranks differ
    (lambda e, f, v: pair_for("blk.0.ffn_gate.weight", f, e), "does not fit"),  # gate is [n_embd -> n_ff]
    (lambda e, f, v: pair_for("blk.1.attn_q.weight", e, e), "has no tensor 'blk.1.attn_q.weight'"),
    (lambda e, f, v: pair_for("token_embd.weight", e, v), "does not fit"),  # an embedding's pair is transposed
    (lambda e, f, v: {"output.weight.lora_a": np.zeros((2, e), np.float32)}, "missing one of"),
    (lambda e, f, v: {**pair_for("output.weight", e, v), "output.weight.extra": np.zeros(4, np.float32)},
     "neither a .lora_a nor a .lora_b"),
    (lambda e, f, v: {"output_norm.weight": np.zeros(e, np.float32)}, "adapts no tensor"),
])
def test_an_adapter_llama_cpp_would_refuse_pairs_with_nothing(write_config, tmp_path, caplog, tensors, why):
    d = folder(tmp_path / "models")
    model = tm.plain(d / "chat.gguf").path
    bad = write_adapter(d / "bad.gguf", tensors(*dims(model)))
    caplog.set_level(logging.INFO, logger=adapterpairing.__name__)
    cat = catalog(write_config, d)
    assert adapters_of(cat, "chat") == {}
    (told,) = [r.getMessage() for r in caplog.records if str(bad) in r.getMessage()]
    assert "fits no model beside it" in told and why in told, told
    cat.refresh()
    assert len([r for r in caplog.records if str(bad) in r.getMessage()]) == 1  # told once, not at every scan


@pytest.mark.parametrize(("tensors", "what"), [
    (lambda e, f, v: pair_for("blk.0.ffn_gate.weight", e, f), "ffn_gate"),
    (lambda e, f, v: pair_for("blk.0.ffn_down.weight", f, e), "ffn_down"),
    (lambda e, f, v: {"token_embd.weight.lora_a": np.zeros((v, 2), np.float32),  # ne [rank, n_vocab]
                      "token_embd.weight.lora_b": np.zeros((e, 2), np.float32)}, "token_embd"),  # ne [rank, n_embd]
    (lambda e, f, v: {**pair_for("output.weight", e, v), "blk.0.attn_norm.weight": np.ones(e, np.float32)},
     "a norm llama.cpp skips"),
])
def test_shapes_that_fit_as_llama_cpp_checks_them_pair(write_config, tmp_path, tensors, what):
    d = folder(tmp_path / "models")
    model = tm.plain(d / "chat.gguf").path
    write_adapter(d / "ok.gguf", tensors(*dims(model)))
    assert list(adapters_of(catalog(write_config, d), "chat")) == ["ok"], what


@pytest.mark.parametrize(("kw", "why"), [({"arch": "qwen2"}, "it is for qwen2, the model is llama"),
                                         ({"adapter_type": "control_vector"}, "not 'lora'")])
def test_another_architecture_or_kind_of_adapter_pairs_with_nothing(write_config, tmp_path, caplog, kw, why):
    d = folder(tmp_path / "models")
    model = tm.plain(d / "chat.gguf").path
    e, _, v = dims(model)
    bad = write_adapter(d / "other.gguf", pair_for("output.weight", e, v), **kw)
    caplog.set_level(logging.INFO, logger=adapterpairing.__name__)
    assert adapters_of(catalog(write_config, d), "chat") == {}
    assert any(str(bad) in r.getMessage() and why in r.getMessage() for r in caplog.records), caplog.text


def test_the_pairing_rule_itself_is_pure():
    def info(arch: str, tensors=(), adapter_type="lora") -> GGUFInfo:
        return GGUFInfo(Path("/x"), 0, arch, None, None, None, None, None, False, kind="adapter",
                        adapter_type=adapter_type, tensors=tuple(tensors))

    adapter = info("llama", [("blk.0.attn_q.weight.lora_a", (8, 2), 64), ("blk.0.attn_q.weight.lora_b", (2, 16), 128)])
    model = info("llama")
    assert lora_pairs(adapter) == {"blk.0.attn_q.weight": ((8, 2), (2, 16))}
    assert fit_problem(adapter, model, {"blk.0.attn_q.weight": (8, 16)}) is None
    assert fit_problem(adapter, model, {"blk.0.attn_q.weight": (8, 16, 4)}) is None  # experts: ne[0], ne[1] as llama.cpp
    assert "does not fit" in fit_problem(adapter, model, {"blk.0.attn_q.weight": (16, 8)})
    assert "has no tensor" in fit_problem(adapter, model, {})
    assert "the model is qwen3" in fit_problem(adapter, info("qwen3"), {"blk.0.attn_q.weight": (8, 16)})
    assert "not 'lora'" in fit_problem(info("llama", adapter.tensors, None), model, {"blk.0.attn_q.weight": (8, 16)})


def test_a_models_shapes_are_read_once_and_again_only_when_a_file_changes(write_config, tmp_path, monkeypatch):
    d = folder(tmp_path / "models")
    model = tm.plain(d / "chat.gguf").path
    tm.lora_adapter(model, d / "ends.gguf")
    reads: list[Path] = []
    monkeypatch.setattr(adapterpairing, "tensor_shapes", lambda p: reads.append(p) or tensor_shapes(p))
    cat = catalog(write_config, d)
    assert reads == [model] and list(adapters_of(cat, "chat")) == ["ends"]
    cat.refresh()
    assert reads == [model] and list(adapters_of(cat, "chat")) == ["ends"]  # the verdict was kept
    st = model.stat()
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    cat.refresh()
    assert reads == [model, model] and list(adapters_of(cat, "chat")) == ["ends"]


def test_the_adapters_of_a_folder_and_the_checks_of_a_scan_are_bounded(write_config, tmp_path, monkeypatch, caplog):
    d = folder(tmp_path / "models")
    model = tm.plain(d / "chat.gguf").path
    for name in ("a", "b", "c"):
        tm.lora_adapter(model, d / f"{name}.gguf")
    monkeypatch.setattr(adapterpairing, "MAX_ADAPTERS", 2)
    caplog.set_level(logging.INFO, logger=adapterpairing.__name__)
    assert list(adapters_of(catalog(write_config, d), "chat")) == ["a", "b"]  # the first by name
    assert any("more than 2 adapters in its folder" in r.getMessage() for r in caplog.records)

    e = folder(tmp_path / "more")
    first = tm.plain(e / "first.gguf").path
    second = e / "second.gguf"
    second.write_bytes(first.read_bytes())
    tm.lora_adapter(first, e / "ends.gguf")
    monkeypatch.setattr(adapterpairing, "MAX_CHECKS", 1)
    cat = catalog(write_config, e)
    assert [len(cat.resolve(n).loras) for n in ("first", "second")] == [1, 0]  # one check this scan
    cat.refresh()
    assert [len(cat.resolve(n).loras) for n in ("first", "second")] == [1, 1]  # the next scan makes the other


def test_a_model_takes_one_adapter_of_a_name(write_config, tmp_path):
    d = folder(tmp_path / "models")
    model = tm.plain(d / "chat.gguf").path
    own = tm.lora_adapter(model, d / "style.gguf")
    (d / "loras").mkdir()
    tm.lora_adapter(model, d / "loras" / "Style.gguf")  # the same name, compared without case
    assert adapters_of(catalog(write_config, d), "chat") == {"style": own}  # its own folder's first


def test_the_header_keeps_an_adapters_tensors_and_reads_a_models_shapes(tmp_path, monkeypatch):
    model = tm.plain(tmp_path / "chat.gguf").path
    e, f, v = dims(model)
    adapter = read_info(tm.lora_adapter(model, tmp_path / "ends.gguf"))
    assert (adapter.kind, adapter.adapter_type) == ("adapter", "lora")
    assert adapter.tensors == (("output.weight.lora_a", (e, 1), 4 * e), ("output.weight.lora_b", (1, v), 4 * v))
    assert read_info(model).tensors == ()  # a model's are not kept
    shapes = tensor_shapes(model)
    assert shapes["output.weight"] == (e, v) and shapes["blk.0.ffn_gate.weight"] == (e, f)
    assert shapes["token_embd.weight"] == (e, v)
    monkeypatch.setattr("gateway.models.ggufmeta.MAX_ADAPTER_TENSORS", 1)
    with pytest.raises(ModelFileError, match="count of tensors is 2"):
        read_info(tmp_path / "ends.gguf")


def test_discovery_lists_no_adapter_as_a_model(tmp_path):
    model = tm.plain(tmp_path / "chat.gguf").path
    tm.lora_adapter(model, tmp_path / "ends.gguf")
    found = discovery.scan([discovery.Root("dir", tmp_path)])
    assert [f.path.name for f in found] == ["chat.gguf"]
    assert [(a.name, a.path.name) for a in found[0].loras] == [("ends", "ends.gguf")]


def test_models_lists_each_models_adapters_under_it(write_config, tmp_path):
    d = folder(tmp_path / "models")
    model = tm.plain(d / "chat.gguf").path
    found = tm.lora_adapter(model, folder(d / "loras") / "ends.gguf")
    other = tm.plain(folder(tmp_path / "elsewhere") / "other.gguf").path
    path = write_config(f"""
        server:
          models_dirs: [{d}]
          discover_default_stores: false
        models:
          configured:
            path: {other}
            loras: {{pirate: {{path: {found}, scale: 0.5}}, Concise: {found}}}
    """)
    r = run_cli("models", "--config", str(path), "--json")
    assert r.returncode == 0, r.stderr
    rows = {row["name"]: row for row in map(json.loads, r.stdout.splitlines())}
    assert rows["chat"]["loras"] == [{"name": "ends", "model": "chat:ends", "path": str(found), "scale": 1.0,
                                      "source": "discovered"}]
    assert [(a["model"], a["scale"], a["source"]) for a in rows["configured"]["loras"]] == [
        ("configured:pirate", 0.5, "models.yaml"), ("configured:Concise", 1.0, "models.yaml")]
    table = run_cli("models", "--config", str(path))
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("configured "))
    assert lines[at + 1].split() == ["+", "configured:pirate", "(LoRA,", "scale", "0.5,", "models.yaml)", str(found)]
    assert lines[at + 2].split()[:2] == ["+", "configured:Concise"]
    at = next(i for i, line in enumerate(lines) if line.startswith("chat "))
    assert lines[at + 1].split() == ["+", "chat:ends", "(LoRA,", "scale", "1,", "discovered)", str(found)]
