"""``assay star status`` says why Krippendorff's alpha is missing, as the dashboard, its API and the report
do (issue 39): below ``reliability.MIN_ALPHA_DIALOGUES`` complete first rounds "too few dialogues (n = 2,
needs >= 10)" in the plain output and in ``--json``, never "-" or a number; from the minimum on the number
with its interval and the dialogues it rests on.

The campaign's human work goes through the real engine (``assign``: claims, dialogues, ratings) on a real
SQLite file, and the command runs in process as ``python -m assay`` runs it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from assay.star import assign
from assay.star.analysis.reliability import MIN_ALPHA_DIALOGUES
from assay.star.spec import CampaignSpec
from assay.store import StarParticipant, open_store
from star_cli import run

SPEC = {
    "name": "st",
    "rules": [{"id": "plain", "text": "be nice", "area": "misc"}],
    "templates": {"default": "Break {{ rule.text }}"},
    "annotators_per_dialogue": 2,
    "arbitration_gap": 3,  # no pair here is 3 points apart: no arbitration, every dialogue a complete round
}
# ten dialogues' two ratings each (0-based Likert points): alpha defined, with variation to estimate
RATED = [(0, 0), (1, 1), (2, 2), (3, 3), (0, 1), (1, 2), (2, 3), (3, 2), (1, 0), (2, 2)]


def _campaign(url: str, ratings: list[tuple[int, int]]) -> None:
    """One human dialogue per pair of ratings, each rated by anna and ben through the engine."""
    sessions: sessionmaker[Session] = open_store(url)
    with sessions.begin() as session:
        campaign = assign.create_campaign(session, CampaignSpec.model_validate(SPEC))
        rows = [
            {"id": f"i{n}", "number": n, "rule_id": "plain", "text": f"x{n}"} for n in range(len(ratings))
        ]
        assign.add_instructions(session, campaign, rows)
        for name, roles in (("rita", ["red_teamer"]), ("anna", ["annotator"]), ("ben", ["annotator"])):
            session.add(StarParticipant(campaign_id=campaign.id, external_id=name, roles=roles, daily_cap=99))
    for pair in ratings:
        task = assign.claim_next(sessions, 1, "red_team")
        assert task is not None
        with sessions.begin() as session:
            assign.submit_dialogue(session, task, "manners", [("user", "hi"), ("assistant", "hello")], "m")
        for annotator, rating in zip((2, 3), pair, strict=True):
            rate = assign.claim_next(sessions, annotator, "annotate")
            assert rate is not None
            assign.submit_annotation(sessions, rate, rating, "because")


@pytest.mark.parametrize("n", [2, len(RATED)])
def test_status_says_why_alpha_is_missing(
    n: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'star.db'}"
    monkeypatch.setenv("ASSAY_DB_URL", url)
    _campaign(url, RATED if n == len(RATED) else [(0, 1), (1, 0)])  # the issue's -0.500 "interval"
    assert len(RATED) == MIN_ALPHA_DIALOGUES  # the second case sits at the minimum
    code, out, _ = run(["status", "st", "--bootstrap", "200"], monkeypatch, capsys)
    assert code == 0, out
    ordinal = next(line for line in out.splitlines() if line.startswith("agreement (ordinal alpha): "))
    nominal = next(
        line for line in out.splitlines() if line.startswith("broken / not broken (nominal alpha): ")
    )
    code, shown, _ = run(["status", "st", "--json", "--bootstrap", "200"], monkeypatch, capsys)
    report = json.loads(shown)
    assert code == 0 and report["complete_first_rounds"] == n
    too_few = f"too few dialogues (n = {n}, needs >= {MIN_ALPHA_DIALOGUES})"
    for line, estimate in ((ordinal, report["agreement"]), (nominal, report["agreement_broken"])):
        said = line.split(": ", 1)[1]
        if n < MIN_ALPHA_DIALOGUES:
            assert said == too_few and estimate["reason"] == too_few
            assert (estimate["alpha"], estimate["low"], estimate["high"]) == (None, None, None)
        else:
            assert estimate["alpha"] is not None and estimate["reason"] == ""
            low, high = f"{estimate['low']:.3f}", f"{estimate['high']:.3f}"
            assert said == f"{estimate['alpha']:.3f} (95% CI {low} to {high}), n = {n} dialogues"
    assert not re.search(r"\balpha -", out)  # the old "alpha -" is gone
