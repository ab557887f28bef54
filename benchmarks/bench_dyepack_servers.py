"""DyePack verification through a third-party OpenAI-compatible server (``transformers serve``, started
from its own command line) against the in-process ``hf:`` backend, on the same model and release.

SmolLM2-135M-Instruct (the offline GGUF, de-quantised once to a float32 folder that both sides load) is
asked a release of short MMLU questions: every backdoor sample once, greedily, in chat and in completion
mode. Prints the server's start time, prompts/s per backend and mode, the ratio against the in-process
run of the same mode, and how many replies were identical. ``--model tiny`` uses a random tiny Llama
(seconds, no SmolLM2) to check the script itself.

    python benchmarks/bench_dyepack_servers.py --rows 80 --fraction 0.4 --max-new-tokens 16

``OMP_WAIT_POLICY=PASSIVE`` for both processes (see bench_hf_batching.py: spinning OpenMP threads on a
shared 2-core machine slow generation several times).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def smollm2_folder(work: Path) -> Path:
    """SmolLM2 de-quantised from the bundled GGUF and saved as an HF folder (both backends load it)."""
    from assay.assets import asset_path
    from assay.models import load_hf

    gguf = asset_path("smollm2")
    model, tokenizer = load_hf(gguf.parent, gguf_file=gguf.name)
    model.hf_quantizer = None
    model.config.__dict__.pop("quantization_config", None)
    folder = work / "smollm2"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def tiny_folder(work: Path, texts: list[str]) -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.tiny_lm import build_tiny_lm
    from transformers import AutoTokenizer

    folder = build_tiny_lm(texts, work / "tiny", hidden=64, layers=2)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    tokenizer.save_pretrained(folder)
    return folder


def release(work: Path, rows: int, fraction: float):
    """A release of the ``rows`` shortest MMLU questions of an even spread, B = 8."""
    from assay.assets import asset_path
    from assay.data import read_benchmark
    from assay.dyepack.prepare import PrepareConfig, prepare_release

    lines = [json.loads(x) for x in asset_path("mmlu").read_text(encoding="utf-8").splitlines()]
    lines = [r for r in lines if r["correct_answer"] in "ABCD"]
    lines.sort(key=lambda r: len(r["question"]) + sum(len(r[f"answer_{c}"]) for c in "abcd"))
    path = work / "mmlu.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines[: 3 * rows : 3]))
    prepared = prepare_release(read_benchmark(path), PrepareConfig(8, fraction, k=4, seed=1), work / "rel")
    return read_benchmark(prepared.release_path, style=prepared.key.style), prepared.key


def start_server(folder: Path, work: Path) -> tuple[subprocess.Popen, str, float]:
    """``transformers serve FOLDER`` on a free port; returns it, its base URL and the seconds to /health."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [str(Path(sys.executable).parent / "transformers"), "serve", str(folder)]
    command += ["--host", "127.0.0.1", "--port", str(port), "--device", "cpu"]
    env = {**os.environ, "HF_HOME": str(work / "hf-home")}
    log = (work / "serve.log").open("w")
    started = time.perf_counter()
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return server, f"http://127.0.0.1:{port}/v1", time.perf_counter() - started
        except OSError:
            if server.poll() is not None:
                tail = (work / "serve.log").read_text()[-2000:]
                raise SystemExit(f"transformers serve failed: {tail}") from None
            time.sleep(0.2)


def timed(model, bench, key, params, mode: str):
    from assay.dyepack.prompts import PromptFormat
    from assay.dyepack.verify import verify

    started = time.perf_counter()
    report, audit = verify(model, "m", bench, key, params, fmt=PromptFormat(mode=mode))  # type: ignore[arg-type]
    return time.perf_counter() - started, report, [r["reply"] for r in audit]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument("--rows", type=int, default=80)
    parser.add_argument("--fraction", type=float, default=0.4)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--modes", nargs="+", default=["chat", "completion"])
    args = parser.parse_args()

    from assay.models import GenerationParams, load_model

    params = GenerationParams(max_new_tokens=args.max_new_tokens)
    with tempfile.TemporaryDirectory(prefix="bench-servers-") as tmp:
        work = Path(tmp)
        bench, key = release(work, args.rows, args.fraction)
        folder = smollm2_folder(work) if args.model == "smollm2" else tiny_folder(work, ["a b c"] * 20)
        samples = sum(len(b.rows) for b in key.backdoors)
        server, url, start_seconds = start_server(folder, work)
        print(f"model {args.model}; {samples} backdoor samples; max_new_tokens {args.max_new_tokens}")
        print(f"transformers serve answered /health {start_seconds:.1f} s after launch")
        print(f"{'mode':11s} {'backend':28s} {'seconds':>8s} {'prompts/s':>10s} {'ratio':>6s} {'same':>7s}")
        try:
            local = load_model(f"hf:{folder}", batch_size=8)
            for mode in args.modes:
                base_s, _, base_replies = timed(local, bench, key, params, mode)
                rate = samples / base_s
                print(f"{mode:11s} {'hf: in process, batch 8':28s} {base_s:8.1f} {rate:10.2f} {1:6.2f}")
                for concurrency in args.concurrency:
                    served = load_model(f"openai:{url}", model_name=str(folder), concurrency=concurrency)
                    seconds, _, replies = timed(served, bench, key, params, mode)
                    same = sum(a == b for a, b in zip(replies, base_replies, strict=True))
                    label = f"transformers serve, conc {concurrency}"
                    print(
                        f"{mode:11s} {label:28s} {seconds:8.1f} {samples / seconds:10.2f} "
                        f"{base_s / seconds:6.2f} {same:3d}/{samples}"
                    )
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
