"""Issue 25 from the attacker's side: how many test labels a team reads from what it is shown.

The attacker knows its own answers and sees its team view (CLI read models, the web pages, the JSON API, the
public exports). It counts the label vectors of the 16-model test split that would have produced exactly what
it sees. Before the disclosure budget one probe submission left 1 of 2^16 (every label read); now at least
2^(16 - leak_bits) remain. Two checks make the count the real one: the views are compared byte for byte under
other label vectors (re-scored by the real ``score_job``), so they depend on the labels through the shown bin
alone; and the bin's size is counted over all 2^16 vectors.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from fastapi import FastAPI
from sqlalchemy import select

from assay.leaderboard import publish, rounds, views
from assay.leaderboard.harness import score_job
from assay.stats.disclosure import partition
from assay.store import Job
from assay.web import accounts
from assay.web.app import create_app
from fake_board import fake_splits, scored
from web_client import PASSWORD, signed_in

N = 16
MODELS = [f"id-{i:08d}" for i in range(N)]
LABELS = np.array([int(c) for c in "0110100111001010"])
TRUTH16 = dict(zip(MODELS, LABELS.tolist(), strict=True))
EVERY = (np.arange(2**N)[:, None] >> np.arange(N)[None, :]) & 1


def probe_answers() -> np.ndarray:
    """The issue's probe: log-odds 2^k (scaled under the clipping), so each label vector scores apart."""
    logits = 25.0 * 2.0 ** np.arange(N) / 2.0 ** (N - 1)
    return 1.0 / (1.0 + np.exp(-logits))


def exact_cross_entropy(p: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    q = np.clip(p, 1e-12, 1 - 1e-12)
    return -(vectors * np.log(q) + (1 - vectors) * np.log(1 - q)).mean(axis=1)


def make_app(tmp_path: Path, disclosure: str) -> FastAPI:
    web = create_app(f"sqlite:///{tmp_path / 'web.db'}")
    with web.state.sessions.begin() as session:
        splits = fake_splits(tmp_path / "splits", TRUTH16)
        rounds.create_round(session, "r1", splits, submission_window_s=0, disclosure=disclosure)
        rounds.set_status(session, "r1", "open")
        alpha = rounds.add_team(session, "alpha")
        accounts.create_user(session, "tom", PASSWORD, ["team_member"], team=alpha)
    return web


@pytest.fixture
def app(tmp_path: Path) -> FastAPI:
    """A round with the worst-case bins (``--disclosure bins``): every outcome leaves >= 2^(n - 8) vectors."""
    return make_app(tmp_path, "bins")


def set_truth(root: Path, labels: np.ndarray) -> None:
    """Rewrite the sealed test split's ground truth (the organiser's copy the scorer reads)."""
    for name, label in zip(MODELS, labels.tolist(), strict=True):
        (root / "test" / "models" / name / "ground_truth.csv").write_text(f"{label}\n")


def rescore(app: FastAPI, root: Path, labels: np.ndarray) -> None:
    set_truth(root, labels)
    with app.state.sessions() as session:
        job_ids = session.scalars(select(Job.id)).all()
    for job_id in job_ids:
        score_job(app.state.sessions, job_id)


TOKENS = re.compile(r'(name="(csrf_token|login_token)" value=")[^"]+"|nonce-[A-Za-z0-9+/=_-]+|nonce="[^"]+"')


def team_faces(app: FastAPI, submission_id: int) -> dict[str, str]:
    """Everything team alpha can see about its test submission, face by face, as text."""
    member = views.Viewer.member_of("alpha")
    faces: dict[str, str] = {}
    with app.state.sessions() as session:
        record = views.submission_view(session, member, submission_id)
        faces["cli results --json"] = record.model_dump_json()
        faces["cli show --json"] = views.standings_view(
            session, member, "r1", "test", best=False
        ).model_dump_json()
        faces["round board"] = views.round_board(session, member, "r1").model_dump_json()
        faces["logs"] = views.submission_logs(session, member, submission_id).model_dump_json()
        faces["roc"] = views.roc_svg(session, record)
        rows = publish.standings(session, "r1", "test", best_per_team=False, public=True)
        faces["export csv"] = publish.to_csv(rows)
        faces["export html"] = publish.to_html(session, "r1", public=True)
    client = signed_in(app, "tom")
    for path in (
        f"/leaderboard/submissions/{submission_id}",
        f"/leaderboard/submissions/{submission_id}/logs",
        "/leaderboard/rounds/r1",
        f"/api/v1/leaderboard/submissions/{submission_id}",
        "/api/v1/leaderboard/rounds/r1/standings?split=test&all=true",
    ):
        response = client.get(path)
        assert response.status_code == 200, (path, response.text[:300])
        faces[path] = TOKENS.sub(r"\1", response.text)
    return faces


def test_one_probe_submission_reveals_at_most_the_budget(app: FastAPI, tmp_path: Path) -> None:
    p = probe_answers()
    root = tmp_path / "splits"
    submission_id = scored(app.state.sessions, "alpha", "test", dict(zip(MODELS, p.tolist(), strict=True)))
    seen = team_faces(app, submission_id)

    # before: the exact cross entropy (as the organiser sees it, and as teams saw it) names one vector
    truth_ce = exact_cross_entropy(p, LABELS[None, :])[0]
    exact = exact_cross_entropy(p, EVERY)
    assert int((np.abs(exact - truth_ce) < 1e-9).sum()) == 1  # 16 of 16 bits

    # after: the team's record carries the disclosed score only, and it holds the true score
    record = json.loads(seen["cli results --json"])
    assert record["sealed"] and set(record["metrics"]) == {
        f"shown_{k}" for k in ("low", "high", "bin", "bins", "share", "bits")
    }
    assert record["metrics"]["shown_low"] <= truth_ce <= record["metrics"]["shown_high"]
    assert record["models"] == [] and record["groups"] == {} and record["flag_counts"] == {}  # issue 44
    assert seen["roc"] == ""
    for face, text in seen.items():
        assert "id-000" not in text, f"{face} names a test model"

    # the attacker's count: label vectors in the shown bin, over all 2^16
    table = partition(p, "cross_entropy", 8)
    same_bin = table.bin_of(EVERY) == table.bin_of(LABELS)
    consistent = int(same_bin.sum())
    bits = N - math.log2(consistent)
    print(
        f"\nprobe on {N} test models: before 1 label vector (16.00 bits); "
        f"after {consistent} ({bits:.2f} bits)"
    )
    assert consistent >= 2**8 and record["metrics"]["shown_bits"] == pytest.approx(bits, abs=1e-12)

    # every face depends on the labels through that bin alone: the same bytes for another vector in it ...
    other = EVERY[np.flatnonzero(same_bin & (EVERY != LABELS).any(axis=1))[-1]]
    rescore(app, root, other)
    assert team_faces(app, submission_id) == seen
    # ... and a vector outside it changes what is shown (the check can fail)
    outside = EVERY[np.flatnonzero(~same_bin)[0]]
    rescore(app, root, outside)
    assert team_faces(app, submission_id)["cli results --json"] != seen["cli results --json"]
    rescore(app, root, LABELS)


def test_the_grid_shows_the_same_bytes_for_every_label_vector_in_the_cell(tmp_path: Path) -> None:
    """The default grid: every face depends on the labels through the shown cell alone, and the cell is one
    of at most 2^8, fixed before the labels were read."""
    app = make_app(tmp_path, "grid")
    p = probe_answers()
    root = tmp_path / "splits"
    submission_id = scored(app.state.sessions, "alpha", "test", dict(zip(MODELS, p.tolist(), strict=True)))
    seen = team_faces(app, submission_id)
    record = json.loads(seen["cli results --json"])
    assert set(record["metrics"]) == {f"shown_{k}" for k in ("low", "high", "cell", "cells")}
    assert record["metrics"]["shown_cells"] <= 2**8
    for face, text in seen.items():
        assert "id-000" not in text, f"{face} names a test model"
    ce = exact_cross_entropy(p, EVERY)
    low, high = record["metrics"]["shown_low"], record["metrics"]["shown_high"]
    same = (ce >= low) & (ce < high)
    other = EVERY[np.flatnonzero(same & (EVERY != LABELS).any(axis=1))[-1]]
    rescore(app, root, other)
    assert team_faces(app, submission_id) == seen
    rescore(app, root, EVERY[np.flatnonzero(~same)[0]])
    assert team_faces(app, submission_id)["cli results --json"] != seen["cli results --json"]
    print(
        f"\ngrid: {int(same.sum())} of 2^16 label vectors show this cell "
        f"({N - math.log2(same.sum()):.2f} bits)"
    )


@pytest.mark.slow
def test_boosting_over_twenty_submissions_gains_no_more_than_the_budget(app: FastAPI) -> None:
    """Blum & Hardt's boosting attack: random confident guesses, keep those the board says beat the
    median, vote. Each shown bin rules out at most what its budget allows; the joint count is the check."""
    rng = np.random.default_rng(2015)
    member = views.Viewer.member_of("alpha")
    alive = np.ones(2**N, dtype=bool)  # label vectors consistent with everything shown so far
    exact_alive = np.ones(2**N, dtype=bool)  # the same, had the exact cross entropy been shown
    kept = []
    for k in range(1, 21):
        signs = rng.integers(0, 2, N)
        p = np.where(signs == 1, 0.75, 0.25)
        submission_id = scored(
            app.state.sessions, "alpha", "test", dict(zip(MODELS, p.tolist(), strict=True))
        )
        with app.state.sessions() as session:
            shown = views.submission_view(session, member, submission_id).metrics
        assert shown["shown_bits"] <= 8 + 1e-12
        table = partition(p, "cross_entropy", 8)
        alive &= table.bin_of(EVERY) == int(shown["shown_bin"]) - 1
        exact = exact_cross_entropy(p, EVERY)
        exact_alive &= np.abs(exact - exact_cross_entropy(p, LABELS[None, :])[0]) < 1e-9
        assert alive[int((LABELS * 2 ** np.arange(N)).sum())]  # the truth is never ruled out
        assert N - math.log2(alive.sum()) <= 8 * k + 1e-9
        if shown["shown_share"] <= 0.5:
            kept.append(signs)
    guess = (np.mean(kept, axis=0) > 0.5).astype(int) if kept else np.zeros(N, dtype=int)
    bits, exact_bits = N - math.log2(alive.sum()), N - math.log2(exact_alive.sum())
    accuracy = float((guess == LABELS).mean())
    print(
        f"\nboosting, 20 submissions: {bits:.2f} bits ruled out (exact scores would give {exact_bits:.2f}); "
        f"majority vote of {len(kept)} kept guesses right on {accuracy:.0%} of models"
    )
    assert bits <= min(N, 20 * 8)
