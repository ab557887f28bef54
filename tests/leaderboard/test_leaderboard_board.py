"""Issue 35, item 1: a sealed test board that performers can use, within what it may reveal.

The grid (the default disclosure) shows a test score as its cell of a fixed grid of at most 2^b cells, fixed
by the round before any label is read: a showing is one of at most 2^b values, so it reveals at most b bits
on average over the labels (checked over all 2^16 label vectors of a probe, with scipy's entropy as the
oracle), while detectors that differ by more than a cell (0.005 of cross entropy at 8 bits) rank apart, in
the order of their exact scores (sklearn's log loss as the oracle). Rows whose shown intervals overlap are
ties, named as such, and no row ranks above one whose interval lies wholly better.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import entropy
from sklearn.metrics import log_loss
from sqlalchemy.orm import Session, sessionmaker

from assay.leaderboard import publish, rounds, views
from assay.leaderboard.disclosure import better
from assay.leaderboard.publish import Standing, rank_rows
from assay.stats.disclosure import CE_MAX, grid_cell, grid_edges, grid_information
from assay.store.engine import open_store
from fake_board import fake_splits, scored

N16 = 16
EVERY16 = (np.arange(2**N16)[:, None] >> np.arange(N16)[None, :]) & 1


def probe_answers() -> np.ndarray:
    """Issue 25's probe: log-odds 2^k, so every label vector scores apart."""
    logits = 25.0 * 2.0 ** np.arange(N16) / 2.0 ** (N16 - 1)
    return 1.0 / (1.0 + np.exp(-logits))


@pytest.mark.parametrize("bits", [1, 2, 4, 7.5, 8, 12, 16])
def test_the_grid_has_at_most_2_to_the_bits_cells_on_the_metric_scale(bits: float) -> None:
    for metric in ("cross_entropy", "brier", "roc_auc"):
        edges = grid_edges(metric, bits)
        assert len(edges) - 1 <= 2**bits and (np.diff(edges) > 0).all()
        assert edges[0] == 0.0 and edges[-1] == (CE_MAX if metric == "cross_entropy" else 1.0)
    fine = grid_edges("cross_entropy", 8)
    assert len(fine) - 1 == 256 and np.allclose(np.diff(fine[:201]), 0.005) and fine[200] == 1.0
    cell = grid_cell(0.2275, fine)
    assert (cell.low, cell.high) == pytest.approx((0.225, 0.230)) and cell.low <= 0.2275 < cell.high


def test_a_probe_learns_at_most_the_budget_on_average_over_every_label_vector() -> None:
    designs = {
        "issue 25 probe": probe_answers(),
        "random answers": np.random.default_rng(35).uniform(0.01, 0.99, N16),
        "boosting guess": np.where(np.random.default_rng(7).integers(0, 2, N16) == 1, 0.75, 0.25),
        "constant 0.5": np.full(N16, 0.5),
    }
    for name, p in designs.items():
        seen = grid_information(p, "cross_entropy", 8)
        # the oracle: the entropy of the shown cell under uniform labels, counted apart with numpy + scipy
        q = np.clip(p, 1e-12, 1 - 1e-12)
        scores = -(EVERY16 * np.log(q) + (1 - EVERY16) * np.log(1 - q)).mean(axis=1)
        cells = np.searchsorted(grid_edges("cross_entropy", 8), scores, side="right")
        oracle = entropy(np.unique(cells, return_counts=True)[1], base=2)
        assert seen.mean_bits == pytest.approx(oracle, abs=1e-9)
        assert seen.mean_bits <= 8 + 1e-12
        print(
            f"\n{name}: {seen.mean_bits:.2f} bits on average over 2^16 label vectors; single outcomes: "
            f"median {np.median(seen.bits):.2f}, {100 * (seen.bits > 10).mean():.2f}% above 10 bits, "
            f"max {seen.bits.max():.2f}"
        )
    assert grid_information(designs["constant 0.5"], "cross_entropy", 8).mean_bits == 0.0


def _answers(labels: np.ndarray, skill: float, rng: np.random.Generator) -> np.ndarray:
    """A detector of the given skill: confident on the right side, with noise (seeded)."""
    logits = skill * (2 * labels - 1) + rng.normal(0.0, 1.0, len(labels))
    return 1.0 / (1.0 + np.exp(-logits))


def make_board40(
    tmp_path: Path, disclosure: str = "grid"
) -> tuple[sessionmaker[Session], dict[str, np.ndarray], np.ndarray]:
    """A 40-model open round with three baseline-like detectors, three teams at 0.5 and one constant 0.9."""
    labels = np.random.default_rng(40).integers(0, 2, 40)
    names = [f"id-{i:08d}" for i in range(40)]
    sessions = open_store(f"sqlite:///{tmp_path / 'lb.db'}")
    with sessions.begin() as session:
        rounds.create_round(
            session,
            "r1",
            fake_splits(tmp_path / "splits", dict(zip(names, labels.tolist(), strict=True))),
            disclosure=disclosure,
        )
        rounds.set_status(session, "r1", "open")
    rng = np.random.default_rng(2026)
    answers = {
        "neural-cleanse": _answers(labels, 3.2, rng),
        "meta-classifier": _answers(labels, 2.9, rng),
        "weak": _answers(labels, 0.8, rng),
        "half-a": np.full(40, 0.5),
        "half-b": np.full(40, 0.5),
        "half-c": np.full(40, 0.5),
        "always-0.9": np.full(40, 0.9),
    }
    for hours, (team, p) in enumerate(answers.items()):
        with sessions.begin() as session:
            rounds.add_team(session, team)
        scored(sessions, team, "test", dict(zip(names, p.tolist(), strict=True)), ago_h=10 - hours)
    return sessions, answers, labels


@pytest.fixture
def board40(tmp_path: Path) -> tuple[sessionmaker[Session], dict[str, np.ndarray], np.ndarray]:
    return make_board40(tmp_path)


def test_the_public_test_board_ranks_by_the_metric_and_names_ties(board40) -> None:  # type: ignore[no-untyped-def]
    sessions, answers, labels = board40
    exact = {team: log_loss(labels, p, labels=[0, 1]) for team, p in answers.items()}
    with sessions() as session:
        rows = publish.standings(session, "r1", "test", public=True)
        organiser = publish.standings(session, "r1", "test", public=False)
    by_team = {row.team: row for row in rows}
    for row in organiser:  # the organiser's numbers are the exact ones (the oracle agrees to 1e-9)
        assert row.metrics["cross_entropy"] == pytest.approx(exact[row.team], abs=1e-9)
    # the public order is the order by exact cross entropy; constant teams tie; the bad constant is last
    assert [row.team for row in rows[:3]] == sorted(
        ("neural-cleanse", "meta-classifier", "weak"), key=exact.get
    )
    assert exact["neural-cleanse"] < exact["meta-classifier"] - 0.01 < exact["weak"]
    assert by_team["neural-cleanse"].rank == 1 and by_team["meta-classifier"].rank == 2
    assert by_team["neural-cleanse"].tied_with == [] and by_team["meta-classifier"].tied_with == []
    assert {by_team[t].rank for t in ("half-a", "half-b", "half-c")} == {4}
    assert by_team["half-a"].tied_with == ["half-b", "half-c"]
    assert rows[-1].team == "always-0.9" and rows[-1].rank == 7 and exact["always-0.9"] > 1.0
    for row in rows:  # shown interval holds the exact score, at most 0.01 wide up to CE 1
        low, high = row.metrics["shown_low"], row.metrics["shown_high"]
        assert low <= exact[row.team] < high and set(row.metrics) == {
            "shown_low",
            "shown_high",
            "shown_cell",
            "shown_cells",
        }
        if high <= 1.0:
            assert high - low <= 0.01
    words = by_team["half-b"].summary
    expected = "test CE between 0.690 and 0.695; rank 4 of 7 (tied with half-a, half-c)"
    assert words == expected + "; exact score when the round closes"
    print("\n" + "\n".join(f"{r.rank}: {r.team} exact {exact[r.team]:.4f} | {r.summary}" for r in rows))


def test_every_face_shows_the_same_words(board40) -> None:  # type: ignore[no-untyped-def]
    sessions, _, _ = board40
    member = views.Viewer.member_of("meta-classifier")
    with sessions() as session:
        board = views.round_board(session, member, "r1")
        own = next(r for r in board.best if r.team == "meta-classifier")
        record = views.submission_view(session, member, own.submission_id)
        page = publish.to_html(session, "r1", public=True)
    assert own.summary.startswith("test CE between ") and "rank 2 of 7;" in own.summary
    assert record.summary.startswith("test CE between ") and record.note.startswith("one of 256 cells")
    assert own.summary.split(";")[0] == record.summary.split(";")[0]
    assert own.summary in page and "<th>ROC</th>" not in page


def _row(team: str, low: float, high: float, minutes: int) -> Standing:
    at = datetime(2026, 11, 27) + timedelta(minutes=minutes)
    return Standing(
        team=team,
        submission_id=minutes,
        technique="",
        submitted_at=at,
        status="done",
        metrics={"shown_low": low, "shown_high": high},
        flagged_models=0,
    )


@given(st.lists(st.tuples(st.floats(0, 2), st.floats(0, 0.5)), min_size=1, max_size=8), st.booleans())
def test_no_row_ranks_above_one_whose_interval_lies_wholly_better(spans, lower) -> None:  # type: ignore[no-untyped-def]
    rows = [_row(f"t{i}", a, a + w, i) for i, (a, w) in enumerate(spans)]
    ranked = rank_rows(rows, "cross_entropy" if lower else "roc_auc", sealed=True)
    shown = [(r.metrics["shown_low"], r.metrics["shown_high"]) for r in ranked]
    pairs = [(i, j) for i in range(len(ranked)) for j in range(i + 1, len(ranked))]
    for i, j in pairs:
        assert not better(shown[j], shown[i], lower)  # a later row is never wholly better
        tied = not better(shown[i], shown[j], lower)
        assert (ranked[j].team in ranked[i].tied_with) == tied
        assert ranked[i].rank <= ranked[j].rank


def test_a_split_the_budget_reveals_whole_warns_the_organiser(tmp_path: Path) -> None:
    sessions = open_store(f"sqlite:///{tmp_path / 'lb.db'}")
    truth = {"id-00000000": 0, "id-00000001": 1}
    with sessions.begin() as session:
        small = rounds.create_round(session, "r1", fake_splits(tmp_path / "small", truth))
        exact = rounds.create_round(session, "r2", fake_splits(tmp_path / "exact", truth), disclosure="exact")
        big = rounds.create_round(
            session, "r3", fake_splits(tmp_path / "big", {f"id-{i:08d}": i % 2 for i in range(9)})
        )
        assert "2 models" in (rounds.disclosure_warning(small) or "")
        assert rounds.disclosure_warning(exact) is None and rounds.disclosure_warning(big) is None
        with pytest.raises(
            Exception, match="--disclosure: 'cells' is not one of refined, grid, belief, bins, exact"
        ):
            rounds.create_round(session, "r4", tmp_path / "big", disclosure="cells")


def test_the_grid_shows_any_ranking_metric_and_bins_withhold_non_additive_ones() -> None:
    from assay.leaderboard.disclosure import disclosed_metrics

    truth = {"a": 0, "b": 1}
    predictions = {"a": 0.2, "b": 0.7}
    shown = disclosed_metrics(predictions, truth, "roc_auc", 8, "grid", 1.0)
    assert shown["shown_high"] == 1.0 and shown["shown_low"] == pytest.approx(1 - 1 / 256)
    assert disclosed_metrics(predictions, truth, "roc_auc", 8, "bins", 1.0) == {}
    assert disclosed_metrics(predictions, truth, "cross_entropy", 8, "exact", 0.3) == {}
    assert math.isclose(disclosed_metrics(predictions, truth, "brier", 2, "grid", 0.3)["shown_high"], 0.5)


def test_belief_bins_rank_like_the_grid_and_tell_a_believer_at_most_the_budget(tmp_path: Path) -> None:
    """``--disclosure belief``: the same public order as the exact scores, the good detectors apart and
    shown narrowly, constant teams tied, and no outcome worth more than b bits to a team believing its
    answers (the stored ``shown_belief_bits``)."""
    sessions, answers, labels = make_board40(tmp_path, "belief")
    exact = {team: log_loss(labels, p, labels=[0, 1]) for team, p in answers.items()}
    with sessions() as session:
        rows = publish.standings(session, "r1", "test", public=True)
        member = views.Viewer.member_of("neural-cleanse")
        own = next(r for r in views.round_board(session, member, "r1").best if r.team == "neural-cleanse")
        record = views.submission_view(session, member, own.submission_id)
    by_team = {row.team: row for row in rows}
    assert [row.team for row in rows[:3]] == ["neural-cleanse", "meta-classifier", "weak"]
    assert by_team["neural-cleanse"].tied_with == [] and by_team["meta-classifier"].rank == 2
    assert {by_team[t].rank for t in ("half-a", "half-b", "half-c")} == {4}
    assert rows[-1].team == "always-0.9"
    for row in rows:
        low, high = row.metrics["shown_low"], row.metrics["shown_high"]
        assert low <= exact[row.team] <= high and row.metrics["shown_belief_bits"] <= 8 + 1e-9
    for team in ("neural-cleanse", "meta-classifier"):
        assert by_team[team].metrics["shown_high"] - by_team[team].metrics["shown_low"] < 0.01
    assert record.note.startswith("the bin of label vectors that score like yours, weighted by your own")


def test_the_default_refined_board_is_never_wider_than_the_grid_and_narrow_where_answers_expect(
    tmp_path: Path,
) -> None:
    """The default (``refined``): the public order is the exact order, the good detectors apart, every
    interval at most one cell of the b - 1 grid (0.01) wide up to CE 1 and holding the exact score, constant
    teams tied, and each submission one of fewer than 2^b showings its answers allow."""
    sessions, answers, labels = make_board40(tmp_path, rounds.DEFAULT_MODE)
    exact = {team: log_loss(labels, p, labels=[0, 1]) for team, p in answers.items()}
    with sessions() as session:
        rows = publish.standings(session, "r1", "test", public=True)
        member = views.Viewer.member_of("weak")
        own = next(r for r in views.round_board(session, member, "r1").best if r.team == "weak")
        record = views.submission_view(session, member, own.submission_id)
    by_team = {row.team: row for row in rows}
    assert rounds.DEFAULT_MODE == "refined"
    assert [row.team for row in rows[:3]] == ["neural-cleanse", "meta-classifier", "weak"]
    assert [by_team[t].tied_with for t in ("neural-cleanse", "meta-classifier", "weak")] == [[], [], []]
    assert {by_team[t].rank for t in ("half-a", "half-b", "half-c")} == {4} and rows[-1].team == "always-0.9"
    for row in rows:
        low, high = row.metrics["shown_low"], row.metrics["shown_high"]
        assert low <= exact[row.team] <= high and row.metrics["shown_showings"] <= 2**8 - 1
        if high <= 1.0:
            assert high - low <= 0.01
    assert record.note.startswith("a cell of the round's grid of 128, narrowed to the scores your own")
    assert "at most 8 bits about the test labels on average" in record.note
    print("\n" + "\n".join(f"{r.rank}: {r.team} exact {exact[r.team]:.4f} | {r.summary}" for r in rows))
