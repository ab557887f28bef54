"""Grouped scores by a cross product of METADATA columns (NIST's ``build_model_lists``), checked against an
independent computation, and ranking in each metric's own direction (cross entropy down, ROC-AUC up) in the
standings, the progress line, the static page and the web pages."""

from __future__ import annotations

import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from assay.cli import main
from assay.errors import UserError
from assay.leaderboard import publish, rounds, views
from assay.leaderboard.scoring import score
from assay.store import open_store
from fake_board import fake_splits, scored

RNG = np.random.default_rng(2026)
N = 60
NAMES = [f"id-{i:08d}" for i in range(N)]
TRUTH = RNG.integers(0, 2, N)
PREDICTIONS = np.clip(0.35 * TRUTH + RNG.uniform(0, 0.65, N), 0, 1)
POISONED = TRUTH == 1
DATASET = RNG.choice(["digits", "mnist"], N)
# empty for clean models, as the zoo writes it; "blend" only on digits, so some combinations never occur
TRIGGER = np.where(POISONED, RNG.choice(["patch", "warp"], N), "")
TRIGGER = np.where((DATASET == "digits") & POISONED & (RNG.random(N) < 0.4), "blend", TRIGGER)
FACTORS = {
    "architecture": RNG.choice(["cnn", "mlp", "resnet"], N),
    "dataset": DATASET,
    "trigger_kind": TRIGGER,
}


def _metadata() -> dict[str, dict[str, str]]:
    return {
        name: {"model_name": name, **{column: str(values[i]) for column, values in FACTORS.items()}}
        for i, name in enumerate(NAMES)
    }


def _by_hand(columns: list[str]) -> dict[str, dict[str, float]]:
    """The groups NIST's harness forms (every combination of the columns' values that holds a model, keyed
    ``[a=x][b=y]``), scored with numpy and scikit-learn: nothing of assay.stats."""
    table = pd.DataFrame({"y": TRUTH, "p": PREDICTIONS, **FACTORS})
    expected = {}
    for combo in itertools.product(*(sorted(table[c].unique()) for c in columns)):
        rows = table
        for column, value in zip(columns, combo, strict=True):
            rows = rows[rows[column] == value]
        if rows.empty:
            continue  # NIST drops empty combinations
        y, p = rows["y"].to_numpy(float), np.clip(rows["p"].to_numpy(float), 1e-12, 1 - 1e-12)
        ce = -(y * np.log(p) + (1 - y) * np.log(1 - p))
        key = "".join(f"[{c}={v}]" for c, v in zip(columns, combo, strict=True))
        expected[key] = {
            "n": len(rows),
            "positives": int(y.sum()),
            "cross_entropy": float(ce.mean()),
            "ce_ci_95": float(1.96 * ce.std() / math.sqrt(len(ce))),
            "brier": float(np.mean((rows["p"].to_numpy(float) - y) ** 2)),
            "roc_auc": float(roc_auc_score(y, p)) if 0 < y.sum() < len(y) else math.nan,
        }
    return expected


def _text(groups: dict) -> str:
    return json.dumps(groups, sort_keys=True)


def _same(got: dict[str, dict[str, float | int]], expected: dict[str, dict[str, float]]) -> None:
    assert set(got) == set(expected)
    for key, metrics in expected.items():
        for name, value in metrics.items():
            if math.isnan(value):
                assert math.isnan(got[key][name]), (key, name)
            else:
                assert got[key][name] == pytest.approx(value, abs=1e-9), (key, name)


@pytest.mark.parametrize(
    "columns",
    [["architecture", "dataset"], ["dataset", "trigger_kind"], ["architecture", "dataset", "trigger_kind"]],
)
def test_cross_product_groups_equal_grouping_by_hand(columns: list[str]) -> None:
    predictions = dict(zip(NAMES, PREDICTIONS.tolist(), strict=True))
    truth = dict(zip(NAMES, TRUTH.tolist(), strict=True))
    spec = "*".join(columns)
    report = score(predictions, truth, _metadata(), group_by=[spec, "dataset"])
    assert report.group_by == [spec, "dataset"]
    _same(report.groups[spec], _by_hand(columns))
    _same(report.groups["dataset"], {k.split("=")[1][:-1]: v for k, v in _by_hand(["dataset"]).items()})
    # the same cross given as a list of columns, or bare, with spaces around the star
    as_list = score(predictions, truth, _metadata(), group_by=[columns])
    assert _text(as_list.groups) == _text({spec: report.groups[spec]})  # NaN (one class) equal as text
    bare = score(predictions, truth, _metadata(), group_by=" * ".join(columns))
    assert _text(bare.groups) == _text({spec: report.groups[spec]})
    assert sum(int(g["n"]) for g in report.groups[spec].values()) == N


def test_three_way_cross_leaves_out_combinations_that_never_occur() -> None:
    predictions = dict(zip(NAMES, PREDICTIONS.tolist(), strict=True))
    truth = dict(zip(NAMES, TRUTH.tolist(), strict=True))
    report = score(predictions, truth, _metadata(), group_by=["dataset*trigger_kind"])
    keys = set(report.groups["dataset*trigger_kind"])
    assert (
        "[dataset=digits][trigger_kind=blend]" in keys and "[dataset=mnist][trigger_kind=blend]" not in keys
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("architecture*", r"'architecture\*' has an empty column name"),
        ("dataset*dataset", r"names column 'dataset' twice"),
        ("architecture*colour", r"metadata: no column 'colour' to group by"),
    ],
)
def test_bad_group_specs_are_one_line(spec: str, message: str) -> None:
    truth = dict(zip(NAMES, TRUTH.tolist(), strict=True))
    with pytest.raises(UserError, match=message):
        score({}, truth, _metadata(), group_by=[spec])


def test_cli_renders_a_cross(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    (tmp_path / "p.csv").write_text("".join(f"{n},{p}\n" for n, p in zip(NAMES, PREDICTIONS, strict=True)))
    (tmp_path / "t.csv").write_text("".join(f"{n},{t}\n" for n, t in zip(NAMES, TRUTH, strict=True)))
    rows = _metadata()
    header = list(next(iter(rows.values())))
    lines = [",".join(header)] + [",".join(r[c] for c in header) for r in rows.values()]
    (tmp_path / "METADATA.csv").write_text("\n".join(lines) + "\n")
    base = ["assay", "leaderboard", "score", "-p", str(tmp_path / "p.csv"), "-t", str(tmp_path / "t.csv")]
    base += ["-m", str(tmp_path / "METADATA.csv"), "-g", "architecture*dataset"]
    for extra in (["--json"], []):
        monkeypatch.setattr(sys, "argv", [*base, *extra])
        with pytest.raises(SystemExit) as exit_:
            main()
        assert not exit_.value.code
        out = capsys.readouterr().out
        if extra:
            report = json.loads(out)
            assert report["group_by"] == ["architecture*dataset"]
            groups = report["groups"]["architecture*dataset"]
            nan_for_null = {
                k: {m: math.nan if v is None else v for m, v in g.items()} for k, g in groups.items()
            }
            _same(nan_for_null, _by_hand(["architecture", "dataset"]))
        else:
            assert "by architecture*dataset" in out and "[architecture=cnn][dataset=digits]" in out


# --- ranking direction ------------------------------------------------------------------------------------

TRUE = {"id-00000000": 0, "id-00000001": 1, "id-00000002": 0, "id-00000003": 1}  # fake_board's truth
# "hedge" orders every model right but never commits: ROC-AUC 1.0, cross entropy -ln 0.55 = 0.598.
HEDGE = {"id-00000000": 0.45, "id-00000001": 0.55, "id-00000002": 0.45, "id-00000003": 0.55}
# "bold" is confident and mostly right, with one pair misordered: ROC-AUC 0.75, cross entropy 0.384.
BOLD = {"id-00000000": 0.01, "id-00000001": 0.99, "id-00000002": 0.6, "id-00000003": 0.55}


@pytest.mark.parametrize(
    ("metric", "order", "best", "words"),
    [
        ("cross_entropy", ["bold", "hedge"], [0.598, 0.384], "lower is better"),
        ("roc_auc", ["hedge", "bold"], [1.0, 1.0], "higher is better"),
    ],
)
def test_two_teams_rank_differently_under_the_two_metrics(
    tmp_path: Path, metric: str, order: list[str], best: list[float], words: str
) -> None:
    sessions = open_store(f"sqlite:///{tmp_path / 'lb.db'}")
    with sessions.begin() as session:
        rounds.create_round(session, "r1", fake_splits(tmp_path / "splits"), metric=metric)
        rounds.set_status(session, "r1", "open")
        for team in ("hedge", "bold"):
            rounds.add_team(session, team)
    scored(sessions, "hedge", "test", HEDGE, ago_h=3)  # hedge first, bold an hour later
    scored(sessions, "bold", "test", BOLD, ago_h=2)
    with sessions() as session:
        table = publish.standings(session, "r1", "test")
        assert [(r.rank, r.team) for r in table] == [(1, order[0]), (2, order[1])]
        values = {r.team: r.metrics for r in table}
        assert values["hedge"]["roc_auc"] == 1.0 and values["bold"]["roc_auc"] == 0.75
        assert values["hedge"]["cross_entropy"] == pytest.approx(-math.log(0.55), abs=1e-12)
        trend = publish.progress(session, "r1")
        assert [round(v, 3) for _, v in trend.overall] == best
        viewer = views.Viewer.organiser()
        shown = views.standings_view(session, viewer, "r1", "test")
        assert [r.team for r in shown.rows] == order
        board = views.round_board(session, viewer, "r1")
        assert board.round.lower_is_better == (metric == "cross_entropy")
        assert [r.team for r in board.best] == order
        page = publish.to_html(
            session, "r1", public=False
        )  # the organiser's page; public: test_leaderboard_leak
    assert f"Ranked by {metric} ({words})" in page
    assert page.index(f"<td>{order[0]}</td>") < page.index(f"<td>{order[1]}</td>")


@pytest.mark.usefixtures("fast_argon2")
def test_web_pages_state_the_round_direction(tmp_path: Path) -> None:
    from assay.web import accounts
    from assay.web.app import create_app
    from web_client import PASSWORD, signed_in

    app = create_app(f"sqlite:///{tmp_path / 'web.db'}")
    with app.state.sessions.begin() as session:
        rounds.create_round(session, "r1", fake_splits(tmp_path / "splits"), metric="roc_auc")
        rounds.set_status(session, "r1", "open")
        accounts.create_user(session, "vic", PASSWORD, ["viewer"])
    client = signed_in(app, "vic")
    assert "roc_auc (higher is better)" in client.get("/leaderboard/rounds/r1").text
    assert "roc_auc (higher is better)" in client.get("/leaderboard").text
    assert "lower is better" not in client.get("/leaderboard/rounds/r1").text
