"""Verification against real HTTP servers: a third-party one (``transformers serve``), and our stub for
what a third-party server cannot be made to do on cue (die mid-run, answer 503)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from tests.tiny_lm import build_tiny_lm
from typer.testing import CliRunner

from assay.data import read_benchmark
from assay.dyepack.cli import app
from assay.dyepack.prepare import PrepareConfig, prepare_release
from assay.dyepack.prompts import PromptFormat
from assay.dyepack.verify import verify
from assay.errors import UserError
from assay.models import GenerationParams, ResponseCache, cache_key, load_model
from assay.models.stub_server import StubServer, serve_stub

PARAMS = GenerationParams(max_new_tokens=6)
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


@pytest.fixture
def release(tmp_path, mmlu_sample):
    prepared = prepare_release(
        read_benchmark(mmlu_sample), PrepareConfig(n_backdoors=4, fraction=0.1, seed=8), tmp_path / "rel"
    )
    return prepared.release_path, prepared.key_path, prepared.key


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def transformers_server(tmp_path_factory):
    """``transformers serve`` pinned to a tiny Llama with a chat template, on 127.0.0.1; yields (base URL,
    model folder). It runs in this process (its ``non_blocking`` mode, the one transformers' own tests use):
    the same FastAPI app and handlers as the command line, without a second interpreter importing torch
    and transformers (``benchmarks/bench_dyepack_servers.py`` runs the command line itself)."""
    from transformers import AutoTokenizer
    from transformers.cli.serve import Serve

    folder = tmp_path_factory.mktemp("served")
    texts = ["The answer is (A). Question options"] * 50
    model_dir = build_tiny_lm(texts, folder / "tiny", hidden=64, layers=2)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(model_dir)
    port = _free_port()
    server = Serve(force_model=str(model_dir), host="127.0.0.1", port=port, device="cpu", non_blocking=True)
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                break
        except OSError:
            if time.monotonic() > deadline:
                server.kill_server()
                pytest.fail("transformers serve did not answer /health within 60 s")
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/v1", model_dir
    server.kill_server()


@pytest.mark.slow
def test_transformers_serve_answers_as_the_in_process_model_does(transformers_server, release):
    """Through a real third-party server: /models fails and the error names --model-name; with the
    name, chat and completion replies equal the in-process hf: backend's greedy replies for every
    backdoor sample; log-likelihood, which the server does not offer, is refused in one line."""
    url, model_dir = transformers_server
    release_path, _, key = release
    bench = read_benchmark(release_path, style=key.style)
    # 500 where no hub cache exists (this machine), else the cached hub models: either way, name it
    with pytest.raises(UserError, match=r"--model-name"):
        verify(load_model(f"openai:{url}"), "served", bench, key, PARAMS)
    served = load_model(f"openai:{url}", model_name=str(model_dir), concurrency=4)
    local = load_model(f"hf:{model_dir}")
    for mode in ("chat", "completion"):
        fmt = PromptFormat(mode=mode)  # type: ignore[arg-type]
        over_http, audit = verify(served, "served", bench, key, PARAMS, fmt=fmt)
        in_process, local_audit = verify(local, "local", bench, key, PARAMS, fmt=fmt)
        assert [r["reply"] for r in audit] == [r["reply"] for r in local_audit]
        assert any(r["reply"] for r in audit)  # it did generate text
        assert over_http.activated == in_process.activated and over_http.format.mode == mode
    with pytest.raises(UserError, match="does not return the prompt's log-probabilities"):
        verify(served, "served", bench, key, PARAMS, fmt=PromptFormat(mode="loglikelihood"))


def _verify_command(url: str, release_path, key_path, cache, out, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "assay", "dyepack", "verify", f"openai:{url}", "--model-name", "stub-model",
        "--release", str(release_path), "--key", str(key_path), "--cache", str(cache), "--out", str(out),
        "--json", *extra,
    ]  # fmt: skip


@pytest.mark.slow
def test_a_killed_verification_resumes_without_asking_a_cached_prompt_again(tmp_path, release):
    """``verify`` is killed (SIGKILL, no clean-up) while it waits on the server; the rerun asks exactly
    the prompts whose replies were not yet cached, and it rides out two 503s with --max-retries 2."""
    release_path, key_path, _ = release
    stub = StubServer(lambda m: "The answer is (B).", latency=0.12)
    cache = tmp_path / "cache.sqlite"
    with serve_stub(stub) as url:
        command = _verify_command(url, release_path, key_path, cache, tmp_path / "out", "--concurrency", "1")
        first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while stub.stats.status_counts[200] < 4 and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        first.send_signal(signal.SIGKILL)
        first.wait()
        time.sleep(0.5)  # a request the client sent just before dying reaches the server now, not later
        asked_first = [body["messages"] for body in stub.stats.chat_bodies]
        model_id = f"openai:{url}#stub-model"
        params = GenerationParams(max_new_tokens=32)  # the CLI's default
        with ResponseCache(cache) as opened:
            cached = {k for k in opened.get_many(cache_key(model_id, params, m) for m in asked_first)}
        # Lost at the kill: the request in flight, and at most the reply the writer thread held for its next
        # commit (replies come 0.12 s apart, one each BATCH_WAIT; under load its commit can lag the reply).
        assert 3 <= len(cached) < 12 and len(asked_first) - len(cached) <= 2

        stub.fail_first, stub.fail_status, stub.retry_after = len(asked_first) + 2, 503, 0.01
        second = subprocess.run([*command, "--max-retries", "2"], capture_output=True, text=True)
        assert second.returncode == 0, second.stderr
    rerun = stub.stats.chat_bodies[len(asked_first) :]
    rerun_keys = [cache_key(model_id, params, body["messages"]) for body in rerun]
    answered = [k for k, body in zip(rerun_keys, rerun, strict=True) if body["_status"] == 200]
    assert stub.stats.status_counts[503] == 2
    assert not cached & set(rerun_keys)  # no cached prompt asked twice
    assert len(answered) == 12 - len(cached) == len(set(answered))
    report = json.loads(second.stdout)
    assert report["samples"] == 12 and report["unparsed"] == 0


def test_max_retries_reaches_the_client_and_a_run_without_retries_stops_at_the_first_503(tmp_path, release):
    release_path, key_path, _ = release
    runner = CliRunner()
    for retries, requests in ((0, 1), (2, 3)):
        stub = StubServer(fail_first=10, fail_status=503, retry_after=0.001)
        with serve_stub(stub) as url:
            command = _verify_command(url, release_path, key_path, tmp_path / "c.sqlite", tmp_path / "o")
            result = runner.invoke(app, [*command[4:], "--max-retries", str(retries), "--concurrency", "1"])
        assert isinstance(result.exception, UserError) and "HTTP 503" in str(result.exception)
        assert stub.stats.chat_requests == requests
