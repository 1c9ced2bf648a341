"""What llama.cpp's grammar parser does with repetitions: the measurements behind the bounds in
``gateway/text/grammar.py`` and ``gateway/text/schemacheck.py``.

Each grammar is handed to ``llama_sampler_init_grammar`` (with a real vocabulary, vocab only) in
a process of its own, so that a crash is a result: for each, whether it parsed, the seconds the
parse took, the process's peak memory over its baseline, and how the process ended.

    .venv/bin/python scripts/grammarbench.py            # the whole table
    echo 'root ::= "x"{0,2000}' | .venv/bin/python scripts/grammarbench.py --one
"""

from __future__ import annotations

import argparse
import ctypes
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIMIT_BYTES = 4 * 2**30  # a run that wants more fails where it is: the table says so


def cases() -> list[tuple[str, str]]:
    """(what, grammar): each repetition spelling at counts from a thousand to a million."""
    x = "\nx ::= [a-z]"
    out = []
    for n in (1000, 2000, 2001, 10_000, 100_000, 1_000_000):
        out += [(f"x{{0,{n}}}", f"root ::= x{{0,{n}}}{x}"), (f"x{{{n}}}", f"root ::= x{{{n}}}{x}")]
    for n in (1000, 5000, 20_000, 30_000):  # llama-cpp-python's spelling of x{0,n}: one nested group each
        out.append((f"{n} nested (x ...)?", "root ::= " + "(x " * n + ")?" * n + x))
    for k in (10, 100, 1000):  # many repetitions in one grammar: what MAX_UNROLLED bounds
        root = "root ::= " + " | ".join(f"r{i}" for i in range(k)) + "\n"
        out.append((f"{k} rules of x{{0,2000}}", root + "".join(f"r{i} ::= x{{0,2000}}\n" for i in range(k)) + x))
    out.append(('"x"{5,3}', 'root ::= "x"{5,3}'))  # a least above the most
    return out


def one(grammar: str) -> dict:
    """Parse ``grammar`` in this process and report."""
    import resource

    import llama_cpp as L

    from gateway.models import testmodels as tm

    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_BYTES, LIMIT_BYTES))

    @L.llama_log_callback
    def quiet(level, text, user_data):
        pass

    L.llama_log_set(quiet, ctypes.c_void_p(0))
    L.llama_backend_init()
    params = L.llama_model_default_params()
    params.vocab_only = True
    vocab_file = tm.find_vocab("llama-spm", cache_dir=REPO / ".cache" / "vocab")
    vocab = L.llama_model_get_vocab(L.llama_model_load_from_file(str(vocab_file).encode(), params))
    base = peak_mib()
    started = time.perf_counter()
    sampler = L.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    return {"parsed": bool(sampler), "seconds": round(time.perf_counter() - started, 4),
            "peak_mib": round(peak_mib() - base, 1)}


def peak_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


def run(grammar: str, timeout: float) -> dict:
    try:
        done = subprocess.run([sys.executable, __file__, "--one"], input=grammar, capture_output=True, text=True,
                              timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {"ended": f"still running after {timeout:.0f} s"}
    if done.returncode < 0:
        return {"ended": signal.Signals(-done.returncode).name}
    lines = done.stdout.strip().splitlines()
    if done.returncode == 0 and lines:
        return json.loads(lines[-1])
    said = (done.stderr.strip().splitlines() or [""])[-1][:60]
    return {"ended": f"exit {done.returncode}: {said}"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--one", action="store_true", help="parse the grammar on stdin here and print the result as JSON")
    ap.add_argument("--timeout", type=float, default=60)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(sys.stdin.read())))
        return
    print(f"{'grammar':28} {'chars':>8}  {'parsed':6} {'seconds':>8} {'peak MiB':>8}  ended")
    for what, grammar in cases():
        r = run(grammar, args.timeout)
        print(f"{what:28} {len(grammar):8}  {str(r.get('parsed', '-')):6} {r.get('seconds', '-'):>8} "
              f"{r.get('peak_mib', '-'):>8}  {r.get('ended', 'ok')}", flush=True)


if __name__ == "__main__":
    main()
