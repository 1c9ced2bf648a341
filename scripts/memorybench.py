"""`scripts/bench.py --memory`: the gateway's memory estimate against what llama.cpp allocates,
on each device this machine has.

For each model and each set of settings, the model is loaded in a worker as the gateway loads
it, and the estimate (``gateway.models.memory.estimate``, on the devices llama.cpp reports) is set
beside llama.cpp's own "buffer size" report, by pool (``ram``, ``cuda0``, ...). The allowance
for a GPU runtime's context (``memory.GPU_CONTEXT``) is left out of the comparison: no buffer
shows it. On a machine with a GPU this is how to see how far the estimate is from that card.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.backends.local import start_local
from gateway.hardware.devices import Inventory
from gateway.models.config import ModelSpec, ServerConfig
from gateway.models.ggufmeta import read_info
from gateway.models.memory import allocated, estimate, gpu_context
from gateway.protocol.topology import Device

MiB = 2**20
# the settings each model is loaded with: the defaults, part of the layers on a GPU, more slots
# with a quantized cache, and the layers kept off the GPU
SETTINGS: list[dict] = [{}, {"n_gpu_layers": "half"}, {"parallel": 2, "n_ctx": 8192, "cache_type_k": "q8_0",
                                                         "cache_type_v": "q8_0"}, {"n_gpu_layers": 0}]


async def one(path: Path, settings: dict, found: list[Device], threads: int) -> dict:
    info = read_info(path)
    if settings.get("n_gpu_layers") == "half":
        settings = {**settings, "n_gpu_layers": max(1, int(info.shape.get("block_count") or 2) // 2)}
    spec = ModelSpec("m", path, n_threads=threads, **settings)
    backend = await start_local(spec, ServerConfig(kv_cache_max_bytes=0, spare_worker=False),
                                on_exit=lambda b, e: None, on_busy=lambda: None, on_progress=lambda f: None)
    try:
        est = estimate(info, spec, found)
        buffers = backend.info["buffers"]
        got = allocated(buffers) or {"devices": {}}
    finally:
        await backend.stop()
    assert est is not None
    pools = {pool: {"estimate": n - gpu_context(pool),
                    "allocated": got["devices"].get(pool, 0)} for pool, n in est.devices.items()}
    for pool, n in got["devices"].items():
        pools.setdefault(pool, {"estimate": 0, "allocated": n})
    # llama.cpp's own report beside the sums: by kind (model, kv, compute, output), then by buffer
    return {"model": path.name, "settings": settings, "pools": pools, "buffers": buffers}


def measure(models: list[Path], threads: int) -> dict:
    found = asyncio.run(Inventory().probe())
    if found is None:
        raise SystemExit("cannot list llama.cpp's devices (see the message above)")
    rows = []
    for path in models:
        for settings in SETTINGS:
            rows.append(asyncio.run(one(path, settings, found, threads)))
    return {"devices": [d.describe() for d in found], "rows": rows}


def report(results: dict) -> str:
    gpus = [d for d in results["devices"] if d["kind"] in ("gpu", "igpu")]
    lines = ["", "memory: the gateway's estimate against llama.cpp's allocation, by device "
             f"({', '.join(d['name'] + ' ' + d['description'] for d in gpus) or 'no GPU: system memory only'}; "
             "a GPU's runtime context left out)",
             "| model | settings | device | estimated MiB | allocated MiB | estimated / allocated |",
             "|---|---|---|---:|---:|---:|"]
    for row in results["rows"]:
        settings = ", ".join(f"{k} {v}" for k, v in row["settings"].items()) or "defaults"
        for pool, figures in row["pools"].items():
            est, got = figures["estimate"] / MiB, figures["allocated"] / MiB
            ratio = f"{est / got:.2f}" if got else "-"
            lines.append(f"| {row['model']} | {settings} | {pool} | {est:.1f} | {got:.1f} | {ratio} |")
    return "\n".join(lines)
