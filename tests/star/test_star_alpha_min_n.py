"""Krippendorff's alpha below its minimum number of dialogues (``reliability.MIN_ALPHA_DIALOGUES``) is
"too few dialogues (n = 2, needs >= 10)", not a number with a degenerate interval, in the read model and the
report alike (issue 39); from the minimum on it is a number with its interval."""

from __future__ import annotations

import html
import re

import pandas as pd
import pytest

from assay.star.analysis.reliability import (
    MIN_ALPHA_DIALOGUES,
    alpha_estimate,
    reliability,
    reliability_matrix,
)
from assay.star.spec import CampaignSpec

SPEC = CampaignSpec.model_validate(
    {
        "name": "small",
        "rules": [{"id": "plain", "text": "be nice", "area": "misc"}],
        "templates": {"default": "Break {{ rule.text }}"},
        "annotators_per_dialogue": 2,
    }
)


def _paired(pairs: list[tuple[int, int]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    rows = [
        {"dialogue_id": d, "kind": "annotate", "ablation": False, "rating": r, "created_at": i}
        for d, pair in enumerate(pairs)
        for i, r in enumerate(pair)
    ]
    annotations = pd.DataFrame(rows).assign(annotation_id=lambda f: range(len(f)))
    dialogues = pd.DataFrame({"dialogue_id": range(len(pairs)), "rule_id": "plain"})
    return annotations, dialogues


def test_two_dialogues_give_a_reason_not_a_number() -> None:
    """The issue's example: alpha -0.500 with the 'interval' -0.500 to -0.500."""
    annotations, dialogues = _paired([(0, 1), (1, 0)])
    report = reliability(annotations, dialogues, SPEC, n_boot=200)
    message = f"too few dialogues (n = 2, needs >= {MIN_ALPHA_DIALOGUES})"
    for estimate in (report.ordinal, report.nominal, *report.by_area["misc"].values()):
        assert (estimate.alpha, estimate.low, estimate.high) == (None, None, None)
        assert estimate.reason == message and estimate.n_units == 2
    no_boot = alpha_estimate(reliability_matrix(annotations), "ordinal", n_boot=0)
    assert no_boot.alpha is None and no_boot.reason == message


@pytest.mark.parametrize("n", [MIN_ALPHA_DIALOGUES - 1, MIN_ALPHA_DIALOGUES])
def test_the_minimum_is_where_alpha_starts(n: int) -> None:
    pairs = [(i % 4, (i + i // 3) % 4) for i in range(n)]
    estimate = alpha_estimate(reliability_matrix(_paired(pairs)[0]), "ordinal", n_boot=200)
    if n < MIN_ALPHA_DIALOGUES:
        assert estimate.alpha is None and estimate.reason.startswith("too few dialogues")
    else:
        assert estimate.alpha is not None and estimate.low is not None and estimate.reason == ""


def test_the_report_page_shows_the_reason_where_alpha_would_be() -> None:
    from assay.star.analysis.report import build_report, render_html

    annotations, dialogues = _paired([(0, 1), (1, 0)])
    frames = {
        "instructions": pd.DataFrame(
            {"id": ["i0", "i1"], "number": [1, 2], "rule_id": "plain", "group_label": ""}
        ),
        "dialogues": dialogues.assign(
            instruction_id=["i0", "i1"], group_label="", red_teamer_relation="none", annotation_arm="none"
        ),
        "annotations": annotations.assign(machine=False, reason="r", annotator_relation="none"),
    }
    page = render_html(build_report(SPEC, frames, n_boot=50), SPEC)
    rows = [html.unescape(r) for r in re.findall(r"<tr><td class=\"l\">all \(.*?</tr>", page, re.S)]
    assert len(rows) == 2
    for row in rows:
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
        assert "too few dialogues (n = 2" in cells[2] and not re.search(r"\d\.\d", " ".join(cells[2:4]))
