"""Pulling models by name through the real `gguf-gateway serve` process, from a Hugging Face hub
and an Ollama registry served on loopback by the tests (`hubserver.Hub`: their real routes,
headers and redirects to a CDN, with faults), the bytes being the real tier's models (Gemma 3
270M, SmolLM2 135M) and tiny ones the tests write. Each pulled model is then asked by the
official clients, and the stores are read back with `huggingface_hub`'s own cache scanner and
the gateway's discovery."""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.request
from pathlib import Path

import ollama
import openai
import pytest
from helpers import ServerProcess, free_port, request, run_cli, tiny_projector
from hubserver import Hub
from realmodel import SMOLLM_SHA256, gemma_path, smollm_path
from realmodel import sha256_of as sha256

from gateway.models import testmodels as tm

pytestmark = [pytest.mark.slow, pytest.mark.real]


def env_for(home: Path, hub: Hub, **extra: str) -> dict[str, str]:
    """A user whose home is ``home``: the stores discovery reads and pulls write are under it."""
    return {"HOME": str(home), "HF_HOME": str(home / ".cache" / "huggingface"), "HF_HUB_CACHE": "",
            "OLLAMA_MODELS": str(home / ".ollama" / "models"), "HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_XET": "1",
            "HF_HUB_OFFLINE": "", "LLAMA_CACHE": "", "XDG_CACHE_HOME": "", "GGUF_GATEWAY_URL": "", **extra}


def config(home: Path, extra: str = "") -> str:
    path = home / "models.yaml"
    path.write_text(f"server:\n  keep_alive: 60\n  memory_reserve: 0\n{extra}")
    return str(path)


def pull_lines(url: str, body: dict, timeout: float = 300) -> list[dict]:
    req = urllib.request.Request(url + "/models/pull", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        assert r.headers["Content-Type"].startswith("application/x-ndjson")
        return [json.loads(line) for line in r if line.strip()]


def hf_blob(home: Path, repo: str, digest: str) -> Path:
    return home / ".cache" / "huggingface" / "hub" / ("models--" + repo.replace("/", "--")) / "blobs" / digest


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("files")
    tm.plain(d / "q4.gguf", ["Four", " bits"])
    tm.plain(d / "q8.gguf", ["Eight", " bits"])
    tm.plain(d / "big.gguf", ["Split", " works"], split_max_tensors=4)
    tm.plain(d / "vision.gguf", ["I", " see"])
    tm.plain(d / "shared.gguf", ["Shared"])
    tm.plain(d / "ondemand.gguf", ["On", " demand"])
    return {"gemma": gemma_path(), "smollm": smollm_path(), **{p.stem: p for p in d.glob("*.gguf")}}


@pytest.fixture(scope="module")
def hub(files):
    with Hub() as h:
        h.add_hf_repo("acme/Gemma-GGUF", {"gemma-3-270m-it-Q4_K_M.gguf": files["gemma"], "README.md": b"Gemma"})
        h.add_hf_repo("acme/Multi-GGUF", {"tiny-Q4_K_M.gguf": files["q4"], "tiny-Q8_0.gguf": files["q8"]})
        h.add_hf_repo("acme/Tie-GGUF", {"a-Q4_K_M.gguf": files["q4"], "b/a-Q4_K_M.gguf": files["q8"]})
        h.add_hf_repo("acme/Split-GGUF", {f"big-Q8_0-{i:05d}-of-00003.gguf": files[f"big-{i:05d}-of-00003"]
                                          for i in (1, 2, 3)})
        h.add_hf_repo("acme/Vision-GGUF", {"vision-Q4_K_M.gguf": files["vision"], "mmproj-F16.gguf": tiny_projector(),
                                           "mmproj-Q8_0.gguf": tiny_projector()})
        h.add_hf_repo("acme/Shared-GGUF", {"shared-Q4_K_M.gguf": files["shared"]})
        h.add_hf_repo("acme/OnDemand-GGUF", {"ondemand-Q4_K_M.gguf": files["ondemand"]})
        h.add_ollama_model("acme", "smol", "latest", files["smollm"],
                           template="{{ .Prompt }}", params={"stop": ["<|im_end|>"]})
        h.add_ollama_model("acme", "q4", "latest", files["q4"])
        yield h


@pytest.fixture(autouse=True)
def calm_hub(hub):
    hub.faults.drop_after = None
    hub.faults.corrupt = set()
    hub.faults.rate = None
    yield


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("home")


@pytest.fixture(scope="module")
def server(home, hub):
    port = free_port()
    env = env_for(home, hub, HF_TOKEN="hf_a_users_own_key")
    with ServerProcess("--config", config(home, f"  ollama_port: {port}\n"), env=env) as srv:
        srv.ollama_port = port
        yield srv


@pytest.fixture
def oai(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="x") as client:
        yield client


@pytest.fixture
def oll(server):
    with ollama.Client(host=server.url) as client:
        yield client


def test_a_dropped_connection_resumes_with_range_and_the_model_answers(server, hub, home, files, oai):
    hub.faults.drop_after, hub.faults.drop_times = 40_000_000, 1
    lines = pull_lines(server.url, {"model": "hf.co/acme/Gemma-GGUF:Q4_K_M"})
    assert lines[0]["status"] == "pulling manifest" and lines[-1] == {"status": "success",
                                                                     "model": "hf.co/acme/Gemma-GGUF:Q4_K_M"}
    assert [line["status"] for line in lines].count("pulling manifest") == 1
    progress = [line for line in lines if "digest" in line]
    assert progress and progress[-1]["completed"] == progress[-1]["total"] == files["gemma"].stat().st_size
    assert all(a["completed"] <= b["completed"] for a, b in zip(progress, progress[1:]))
    want = sha256(files["gemma"])
    resumed = [r for r in hub.log if r.server == "cdn" and want in r.path and r.headers.get("Range")]
    assert resumed and resumed[0].headers["Range"].startswith("bytes=") and resumed[0].status == 206
    assert int(resumed[0].headers["Range"][6:].rstrip("-")) > 0
    assert sha256(hf_blob(home, "acme/Gemma-GGUF", want)) == want
    # the user's HF_TOKEN goes to the hub, never to the CDN its answers point at
    asked = [r for r in hub.log if r.server == "hub" and "Gemma-GGUF" in r.path]
    assert asked and all(r.headers.get("Authorization") == "Bearer hf_a_users_own_key" for r in asked)
    assert not [r for r in hub.log if r.server == "cdn" and r.headers.get("Authorization")]

    from huggingface_hub import scan_cache_dir
    cache = scan_cache_dir(home / ".cache" / "huggingface" / "hub")
    [repo] = [r for r in cache.repos if r.repo_id == "acme/Gemma-GGUF"]
    [rev] = repo.revisions
    assert {f.file_name for f in rev.files} == {"gemma-3-270m-it-Q4_K_M.gguf"} and not cache.warnings
    assert [f.size_on_disk for f in rev.files] == [files["gemma"].stat().st_size]

    client = oai
    answer = client.chat.completions.create(model="hf.co/acme/Gemma-GGUF:Q4_K_M", max_tokens=8,
                                            messages=[{"role": "user", "content": "Say hi."}])
    assert answer.choices[0].message.content
    assert answer.model == "gemma-3-270m-it-q4_k_m"
    with urllib.request.urlopen(server.url + "/metrics") as r:
        metrics = r.read().decode()
    assert 'gguf_gateway_pulls_total{outcome="done",source="huggingface"}' in metrics
    assert any(line.startswith('gguf_gateway_pull_bytes_total{source="huggingface"}')
               and float(line.split()[-1]) >= files["gemma"].stat().st_size for line in metrics.splitlines())


def test_a_corrupt_blob_is_refused_and_deleted(server, hub, home, files):
    digest = "sha256:" + sha256(files["q4"])
    hub.faults.corrupt = {digest}
    name = f"{hub.host}/acme/q4:latest"
    status, body, _ = request(server.url + "/api/pull", {"model": name, "insecure": True, "stream": False})
    assert status == 502 and "SHA-256" in body["error"], body
    store = home / ".ollama" / "models"
    blob = store / "blobs" / digest.replace(":", "-")
    assert not blob.exists() and not list(store.glob("blobs/*partial*"))
    assert not (store / "manifests" / hub.host / "acme" / "q4" / "latest").exists()
    hub.faults.corrupt = set()
    status, body, _ = request(server.url + "/api/pull", {"model": name, "insecure": True, "stream": False})
    assert (status, body) == (200, {"status": "success"})
    assert sha256(blob) == digest[7:]


def test_an_unknown_name_is_a_404_on_every_route(server, hub, home):
    for name in ("acme/Nothing-GGUF", "hf.co/acme/Nothing", f"{hub.host}/acme/nothing:latest"):
        status, body, _ = request(server.url + "/models/pull", {"model": name, "insecure": True, "stream": False})
        assert status == 404 and body["error"]["code"] == "model_not_found" and body["error"]["param"] == "model"
        status, body, _ = request(server.url + "/api/pull", {"model": name, "insecure": True})  # streamed
        assert status == 404 and isinstance(body["error"], str), body
    with pytest.raises(ollama.ResponseError) as err, ollama.Client(host=server.url) as client:
        client.pull("hf.co/acme/Nothing", stream=False)
    assert err.value.status_code == 404
    status, body, _ = request(server.url + "/models/pull", {"model": "../etc/passwd"})
    assert status == 400 and body["error"]["param"] == "model"
    out = run_cli("pull", "hf.co/acme/Nothing", "--url", server.url)
    assert out.returncode == 1 and out.stderr.startswith("error:") and "Nothing" in out.stderr


def test_a_repo_of_several_quantizations_gives_q4_k_m_by_default_and_a_tie_is_an_error(server, hub, home, oai):
    snapshot = home / ".cache" / "huggingface" / "hub" / "models--acme--Multi-GGUF" / "snapshots"
    assert pull_lines(server.url, {"model": "acme/Multi-GGUF"})[-1]["status"] == "success"
    assert [p.name for p in snapshot.glob("*/*.gguf")] == ["tiny-Q4_K_M.gguf"]
    assert pull_lines(server.url, {"model": "hf.co/acme/Multi-GGUF:q8_0"})[-1]["status"] == "success"
    assert sorted(p.name for p in snapshot.glob("*/*.gguf")) == ["tiny-Q4_K_M.gguf", "tiny-Q8_0.gguf"]
    client = oai
    for name, said in (("hf.co/acme/Multi-GGUF:Q8_0", "Eight bits"), ("acme/multi-gguf:q4_k_m", "Four bits")):
        answer = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "?"}])
        assert answer.choices[0].message.content == said
    status, body, _ = request(server.url + "/models/pull", {"model": "acme/Tie-GGUF", "stream": False})
    assert status == 400 and body["error"]["code"] == "ambiguous_model_name"
    assert "a-Q4_K_M.gguf" in body["error"]["message"] and "b/a-Q4_K_M.gguf" in body["error"]["message"]
    assert not (home / ".cache" / "huggingface" / "hub" / "models--acme--Tie-GGUF" / "snapshots").exists()


def test_every_part_of_a_split_model_comes_down(server, hub, home, oai):
    assert pull_lines(server.url, {"model": "acme/Split-GGUF:Q8_0"})[-1]["status"] == "success"
    parts = sorted(p.name for p in (home / ".cache/huggingface/hub/models--acme--Split-GGUF/snapshots").glob("*/*"))
    assert parts == [f"big-Q8_0-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    client = oai
    answer = client.chat.completions.create(model="hf.co/acme/Split-GGUF:Q8_0", messages=[{"role": "user", "content": "?"}])
    assert answer.choices[0].message.content == "Split works"


def test_a_projector_comes_with_its_model_and_is_paired(server, hub, home):
    assert pull_lines(server.url, {"model": "hf.co/acme/Vision-GGUF"})[-1]["status"] == "success"
    files = sorted(p.name for p in (home / ".cache/huggingface/hub/models--acme--Vision-GGUF/snapshots").glob("*/*"))
    assert files == ["mmproj-F16.gguf", "vision-Q4_K_M.gguf"]  # one projector: the F16 one, as discovery pairs
    _, models = server.get("/models")
    [row] = [m for m in models["data"] if "hf.co/acme/vision-gguf" in m["aliases"]]
    assert row["mmproj"].endswith("mmproj-F16.gguf")


def test_two_pulls_of_one_model_share_one_download(server, hub, home, files):
    hub.faults.rate = 2_000_000
    results: list[list[dict]] = []
    threads = [threading.Thread(target=lambda: results.append(pull_lines(server.url, {"model": "acme/Shared-GGUF"})))
               for _ in range(2)]
    for t in threads:
        t.start()
        time.sleep(0.3)
    for t in threads:
        t.join(120)
    assert len(results) == 2 and all(r[-1]["status"] == "success" for r in results)
    want = sha256(files["shared"])
    assert len([r for r in hub.log if r.server == "cdn" and want in r.path and r.method == "GET"]) == 1
    _, models = server.get("/models")
    [pull] = [p for p in models["pulls"] if p["name"] == "hf.co/acme/Shared-GGUF"]
    assert pull["state"] == "done" and pull["completed"] == pull["total"] == files["shared"].stat().st_size


def test_the_official_ollama_client_pulls_with_progress_and_the_model_answers(server, hub, home, files, oll):
    name = f"{hub.host}/acme/smol:latest"
    client = oll
    progress = list(client.pull(name, insecure=True, stream=True))
    statuses = [p.status for p in progress]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
    sized = [p for p in progress if p.total]
    assert sized and any(p.completed == p.total == files["smollm"].stat().st_size for p in sized)
    assert all(p.digest.startswith("sha256:") for p in sized)
    assert "verifying sha256 digest" in statuses and "writing manifest" in statuses
    assert name.lower() in [m.model for m in client.list().models]
    _, models = server.get("/models")
    [row] = [m for m in models["data"] if m["id"] == name.lower()]
    assert row["source"] == "ollama" and Path(row["path"]).name == "sha256-" + SMOLLM_SHA256
    answer = client.chat(model=name, messages=[{"role": "user", "content": "Hi"}], options={"num_predict": 4})
    assert answer.message.content
    client.delete(name)
    assert name.lower() not in [m.model for m in client.list().models]
    assert not (home / ".ollama" / "models" / "blobs" / f"sha256-{SMOLLM_SHA256}").exists()


def test_too_little_disk_is_a_507_that_leaves_nothing(tmp_path, hub):
    with ServerProcess("--config", config(tmp_path, "  pull_keep_free_bytes: 1000000000000000\n"),
                       env=env_for(tmp_path, hub)) as srv:
        status, body, _ = request(srv.url + "/models/pull", {"model": "acme/Multi-GGUF", "stream": False})
        assert status == 507 and body["error"]["code"] == "insufficient_storage", body
        assert "free" in body["error"]["message"]
    repo = tmp_path / ".cache" / "huggingface" / "hub" / "models--acme--Multi-GGUF"
    assert not [p for p in repo.rglob("*") if p.is_file() and not p.name.endswith(".lock")]


def test_a_gateway_restarted_mid_pull_resumes_from_what_is_on_disk(tmp_path, hub, files):
    hub.faults.rate = 20_000_000
    env = env_for(tmp_path, hub)
    first = ServerProcess("--config", config(tmp_path), env=env)
    with first:
        threading.Thread(target=lambda: _ignore(pull_lines, first.url, {"model": "acme/Gemma-GGUF"}),
                         daemon=True).start()
        deadline = time.monotonic() + 60
        done = 0
        while time.monotonic() < deadline and done < 30_000_000:
            _, models = first.get("/models")
            done = max([p["completed"] for p in models["pulls"]] or [0])
            time.sleep(0.2)
        assert done >= 30_000_000
        first.stop(signal.SIGKILL)
    want = sha256(files["gemma"])
    partial = hf_blob(tmp_path, "acme/Gemma-GGUF", want).with_name(want + ".incomplete")
    held = partial.stat().st_size
    assert held >= 30_000_000
    hub.faults.rate = None
    with ServerProcess("--config", config(tmp_path), env=env) as second:
        assert pull_lines(second.url, {"model": "acme/Gemma-GGUF"})[-1]["status"] == "success"
    ranges = [r.headers.get("Range") for r in hub.log if r.server == "cdn" and want in r.path]
    assert f"bytes={held}-" in ranges
    assert sha256(hf_blob(tmp_path, "acme/Gemma-GGUF", want)) == want and not partial.exists()


def _ignore(fn, *args) -> None:
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 (the server is killed under it)
        pass


def test_a_request_naming_a_hub_model_pulls_it_on_demand(tmp_path, hub):
    env = env_for(tmp_path, hub)
    with ServerProcess("--config", config(tmp_path, "  pull_on_demand: [hf.co/acme/]\n"), env=env) as srv:
        with openai.OpenAI(base_url=srv.url + "/v1", api_key="x") as client:
            with pytest.raises(openai.NotFoundError):  # not an allowed prefix: no pull, the 404 it always was
                client.chat.completions.create(model="acme/OnDemand-GGUF", messages=[{"role": "user", "content": "?"}])
            assert not [r for r in hub.log if "OnDemand" in r.path and r.time > time.time() - 5]
            with urllib.request.urlopen(urllib.request.Request(
                    srv.url + "/v1/chat/completions", headers={"Content-Type": "application/json"},
                    data=json.dumps({"model": "hf.co/acme/OnDemand-GGUF", "stream": True,
                                     "messages": [{"role": "user", "content": "?"}]}).encode()), timeout=120) as r:
                raw = r.read().decode()
            assert ": loading" in raw and "On" in raw and "demand" in raw
            answer = client.chat.completions.create(model="hf.co/acme/Multi-GGUF:Q8_0",
                                                    messages=[{"role": "user", "content": "?"}])
            assert answer.choices[0].message.content == "Eight bits"
            with pytest.raises(openai.NotFoundError):
                client.chat.completions.create(model="hf.co/acme/Nothing-GGUF", messages=[{"role": "user", "content": "?"}])


def test_offline_is_a_clear_error_at_once(tmp_path, hub):
    env = env_for(tmp_path, hub, HF_HUB_OFFLINE="1")
    with ServerProcess("--config", config(tmp_path), env=env) as srv:
        started = time.monotonic()
        status, body, _ = request(srv.url + "/models/pull", {"model": "hf.co/acme/Multi-GGUF", "stream": False})
        assert status == 503 and "HF_HUB_OFFLINE" in body["error"]["message"]
        assert time.monotonic() - started < 10


def test_the_cli_pulls_and_removes_with_no_gateway_running(tmp_path, hub, files):
    env = env_for(tmp_path, hub)
    out = run_cli("pull", "hf.co/acme/Multi-GGUF:Q4_K_M", "--config", config(tmp_path), env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "pulling manifest" and "success" in lines
    assert any(line.startswith("pulling ") and line.endswith(")") for line in lines)  # one plain line per file
    pointer = Path(lines[-1])
    assert pointer.name == "tiny-Q4_K_M.gguf" and sha256(pointer) == sha256(files["q4"])
    out = run_cli("rm", "hf.co/acme/Multi-GGUF:Q4_K_M", "--config", config(tmp_path), env=env)
    assert out.returncode == 0, out.stderr
    assert not pointer.exists() and not (tmp_path / ".cache/huggingface/hub/models--acme--Multi-GGUF").exists()
    out = run_cli("rm", "hf.co/acme/Multi-GGUF:Q4_K_M", "--config", config(tmp_path), env=env)
    assert out.returncode == 1 and "error:" in out.stderr


def test_deleting_by_name_leaves_files_the_gateway_did_not_pull(server, home):
    mine = home / "models" / "mine.gguf"
    mine.parent.mkdir(exist_ok=True)
    tm.plain(mine, ["Mine"])
    status, body, _ = request(server.url + "/models/delete", {"model": "mine"})
    assert status == 409 and body["error"]["code"] == "not_a_pulled_model", body
    assert mine.exists()
    status, body, _ = request(server.url + "/models/delete", {"model": "no-such-model"})
    assert status == 404
