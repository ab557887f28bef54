"""Fuzz the JSON API with schemathesis (its command line, `st run`) against the OpenAPI document the app
serves, over real HTTP on 127.0.0.1: no input, signed in as an organiser or anonymous, may produce a 5xx,
and every documented response must match its schema.

The database is seeded with the demo data (``assay serve --demo``: users of every role, an open round over
the test zoo round, a campaign with a dialogue, a registered DyePack release), so requests reach real rows.
(schemathesis' pytest plugin does not load under pytest 9.2, hence the command line.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from assay.web.app import create_app
from assay.web.demo import seed_demo
from web_server import serve_in_thread  # tests/ is on sys.path (rootdir conftest)

ST = Path(sys.executable).with_name("st")
CHECKS = "not_a_server_error,response_schema_conformance"
pytestmark = pytest.mark.slow  # schemathesis over every operation, on the 20-model round


def _fuzz(base_url: str, cwd: Path, *headers: str) -> subprocess.CompletedProcess[str]:
    args = [str(ST), "run", f"{base_url}/api/v1/openapi.json", "--checks", CHECKS, "--max-examples", "30"]
    args += ["--seed", "1", "--request-timeout", "30", "--phases", "examples,coverage,fuzzing"]
    for header in headers:
        args += ["-H", header]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "", "NO_COLOR": "1"}
    return subprocess.run(args, capture_output=True, text=True, timeout=600, env=env, cwd=cwd)


def test_api_fuzz_finds_no_server_errors(tmp_path: Path, small_round: Path) -> None:
    app = create_app(f"sqlite:///{tmp_path / 'web.db'}")
    seeded = seed_demo(app.state.sessions, tmp_path / "demo", round_dir=small_round / "splits")
    with serve_in_thread(app) as base_url:
        signed_in = _fuzz(base_url, tmp_path, f"Authorization: Bearer {seeded.organiser_token}")
        anonymous = _fuzz(base_url, tmp_path)
    for run in (signed_in, anonymous):
        assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
        assert "API Operations" in run.stdout and " passed" in run.stdout  # it really ran
