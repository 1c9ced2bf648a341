"""llama.cpp's load settings are declared once (``protocol.settings.LlamaSettings``): each field is
a models.yaml key, a ``ModelSpec`` attribute and a ``LoadParams`` field that crosses the worker's
pipe as its own type, with no other list of them to keep in step."""

from dataclasses import fields
from pathlib import Path

import yaml

from gateway import protocol
from gateway.backends.local import load_params
from gateway.models.config import ServerConfig, load_config
from gateway.protocol.settings import LlamaSettings, settings_of

# A value other than the default for every setting, as models.yaml writes it, and as the spec
# keeps it. A new setting fails the first assertion below until it has its line here.
SAMPLES = {
    "n_ctx": (1024, 1024),
    "n_gpu_layers": (0, 0),
    "n_threads": (3, 3),
    "n_batch": (256, 256),
    "parallel": (2, 2),
    "flash_attn": (True, True),
    "repack": (True, True),
    "swa_full": (False, False),
    "use_mmap": (False, False),
    "chat_template": ("{{ messages }}", "{{ messages }}"),
    "rpc": (["box:50052", "10.0.0.2:50053"], ("box:50052", "10.0.0.2:50053")),
    "reranker": (True, True),
    "cache_type_k": ("q8_0", "q8_0"),
    "cache_type_v": ("q4_0", "q4_0"),
    "n_ubatch": (128, 128),
    "n_threads_batch": (2, 2),
    "main_gpu": (1, 1),
    "split_mode": ("row", "row"),
    "tensor_split": ([3, 1], (3.0, 1.0)),
    "devices": (["CUDA0", "Vulkan1"], ("CUDA0", "Vulkan1")),
    "use_mlock": (True, True),
    "rope_freq_base": (20000, 20000.0),
    "rope_freq_scale": (0.5, 0.5),
    "kv_unified": (True, True),
    "lora": (["a.gguf", {"path": "/x/b.gguf", "scale": 0.25}], None),  # kept: relative to the file (below)
    "spm_infill": (True, True),
    "prompt_cache_bytes": ("512MiB", 512 * 2**20),
    "cache_reuse": (256, 256),
    "ctx_checkpoints": (4, 4),
    "mmproj": ("mmproj-m.gguf", None),  # kept: relative to the file (below)
    "spec_type": ("none", "none"),
    "spec_ngram_size_n": (3, 3),
    "spec_ngram_size_m": (32, 32),
    "draft": ("draft.gguf", None),  # kept: relative to the file (below)
    "draft_n_gpu_layers": (0, 0),
    "draft_n_ctx": (2048, 2048),
    "draft_max": (8, 8),
    "draft_min": (2, 2),
    "draft_p_min": (0.5, 0.5),
}


def test_every_setting_is_a_models_yaml_key_that_reaches_the_worker_as_its_own_type(tmp_path):
    assert set(SAMPLES) == {f.name for f in fields(LlamaSettings)}
    entry = {"path": "m.gguf", **{name: written for name, (written, _) in SAMPLES.items()}}
    (tmp_path / "models.yaml").write_text(yaml.safe_dump({"models": {"m": entry}}))
    spec = load_config(tmp_path / "models.yaml", check_files=False).models[0]
    kept = {name: value for name, (_, value) in SAMPLES.items()}
    kept["lora"] = ((tmp_path / "a.gguf", 1.0), (Path("/x/b.gguf"), 0.25))
    kept["mmproj"] = tmp_path / "mmproj-m.gguf"
    kept["draft"] = tmp_path / "draft.gguf"
    assert settings_of(spec) == kept
    assert all(getattr(spec, f.name) != f.default for f in fields(LlamaSettings))  # each one read, none left out

    params = load_params(spec, ServerConfig())
    assert settings_of(params) == kept
    assert (params.name, params.path, params.embeddings) == ("m", str(tmp_path / "m.gguf"), True)  # a reranker embeds
    command = protocol.Load(params)
    assert protocol.decode_command(protocol.encode_command(command)[4:]) == command  # tuples and paths as they were


def test_unset_settings_keep_their_defaults_through_the_pipe():
    params = protocol.LoadParams("m", "/m.gguf")
    back = protocol.decode_command(protocol.encode_command(protocol.Load(params))[4:])
    assert back == protocol.Load(params) and back.model.devices is None and back.model.lora == ()
