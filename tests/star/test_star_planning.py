"""assay.star.planning and `assay star plan-power`: the dialogues each in-group vs out-group test needs, the
pool's part in it, and the warnings `design` and `init` print when the planned campaign is too small."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from assay.cli import main
from assay.star.participants import load_pool
from assay.star.planning import ALL, ANNOTATION, RED_TEAM, plan_power
from assay.star.spec import load_spec
from assay.stats.power import n_needed

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "star-campaign.yaml"
POOL = """id,name,roles,expertise,race,gender
a,A,red_teamer;annotator,,Asian,female
b,B,red_teamer;annotator,,Black,male
c,C,annotator;arbitrator,medical,White,female
d,D,annotator,,Hispanic;White,male
e,E,red_teamer;annotator,,prefer not to say,female
f,F,red_teamer;annotator,,Asian,male
"""


def test_without_a_pool_the_plan_is_the_design_effect_times_the_independent_size() -> None:
    """Needed dialogues x share of the side x ratings per dialogue / design effect = the independent sample
    size of assay.stats.power (1e-9); the example's 120 dialogues fall short, 10,000 do not."""
    spec = load_spec(EXAMPLE)
    plan = plan_power(spec)
    assert plan.targeted == pytest.approx(80) and len(plan.rows) == 2 * (1 + 19)
    arms = spec.annotation_arms
    sides = {RED_TEAM: (0.5, 0.5, 1), ANNOTATION: (arms.in_group + arms.both, arms.out_group + arms.both, 2)}
    for row in plan.rows:
        in_share, out_share, m = sides[row.test]
        deff = 1 + (m - 1) * spec.power.icc
        assert (row.design_effect_in, row.design_effect_out, row.per_dialogue) == (deff, deff, m)
        independent = n_needed(plan.h, 0.05, 0.8, out_share / in_share)
        assert row.needed * in_share * m / deff == pytest.approx(independent, rel=1e-9)
        assert not row.enough and row.power < 0.8 and row.note == ""
    assert [line.split(":")[0] for line in plan.warnings()] == [
        f"{RED_TEAM} test ({ALL})",
        f"{ANNOTATION} test ({ALL})",
        f"{RED_TEAM} test per target group",
        f"{ANNOTATION} test per target group",
    ]
    assert "19 of 19 groups too small (about 4 dialogues each" in plan.warnings()[2]
    big = plan_power(spec, dialogues=10_000)
    assert big.warnings() == [] and all(r.enough and r.power >= 0.8 for r in big.rows)
    one_arm = spec.model_copy(update={"annotation_arms": spec.annotation_arms.model_validate("in-group")})
    notes = {r.note for r in plan_power(one_arm).rows if r.test == ANNOTATION}
    assert notes == {"no out-group side in the design"}


def test_a_pool_counts_who_may_take_each_side_and_caps_what_dialogues_can_buy(tmp_path: Path) -> None:
    spec = load_spec(EXAMPLE)
    path = tmp_path / "pool.csv"
    path.write_text(POOL)
    pool = load_pool(path, spec)
    plan = plan_power(spec, pool=pool, dialogues=5_000)
    assert plan.pool is not None
    assert plan.pool["race=Asian"] == {
        "in-group red teamers": 2,  # a, f
        "out-group red teamers": 1,  # b; e preferred not to say
        "in-group annotators": 2,
        "out-group annotators": 3,  # b, c, d
    }
    assert plan.pool[ALL]["in-group annotators"] == 6  # e too: in-group for gender=female
    rows = {(r.test, r.scope): r for r in plan.rows}
    assert rows[(RED_TEAM, "gender=non-binary")].note == "no in-group red teamer in the pool"
    assert rows[(RED_TEAM, "gender=non-binary")].needed is None
    free = rows[(ANNOTATION, ALL)]
    assert free.needed is not None and free.enough  # person_icc 0: the pool only names who may take a side
    clustered = plan_power(spec, pool=pool, dialogues=5_000, person_icc=0.2)
    capped = {(r.test, r.scope): r for r in clustered.rows}[(ANNOTATION, ALL)]
    assert capped.needed is None and capped.note == "pool too small at any size" and not capped.enough
    assert capped.design_effect_in > free.design_effect_in


def run(args: list[str], monkeypatch: pytest.MonkeyPatch, capsys) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["assay", "star", *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    out, err = capsys.readouterr()
    return int(exit_.value.code or 0), out, err


def test_plan_power_command_and_design_time_warnings(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("ASSAY_DB_URL", f"sqlite:///{tmp_path / 'star.db'}")
    (tmp_path / "pool.csv").write_text(POOL)
    code, out, _ = run(
        [
            *("plan-power", str(EXAMPLE), "--pool", str(tmp_path / "pool.csv")),
            *("--difference", "0.2", "--json"),
        ],
        monkeypatch,
        capsys,
    )
    plan = json.loads(out)
    assert code == 0 and plan["other"] == pytest.approx(0.5) and plan["pool"]["race=Asian"]
    code, out, _ = run(["plan-power", str(EXAMPLE), "-n", "20000"], monkeypatch, capsys)
    assert code == 0 and "short" not in out and "gender=female" in out
    code, _, err = run(
        ["plan-power", str(EXAMPLE), "--odds-ratio", "2", "--difference", "0.1"], monkeypatch, capsys
    )
    assert code == 2 and "not both" in err
    code, _, err = run(["plan-power", str(EXAMPLE), "--alpha", "2"], monkeypatch, capsys)
    assert code == 2 and "plan-power options: field 'alpha'" in err and len(err.strip().splitlines()) == 1
    code, _, err = run(["design", str(EXAMPLE), "--out", str(tmp_path / "i.jsonl")], monkeypatch, capsys)
    assert code == 0 and "warning: red-team success test (all target groups): 80 group-targeted" in err
    code, out, _ = run(
        ["design", str(EXAMPLE), "-o", str(tmp_path / "j.jsonl"), "--json"], monkeypatch, capsys
    )
    assert len(json.loads(out)["power_warnings"]) == 4
    code, out, err = run(["init", str(EXAMPLE)], monkeypatch, capsys)
    assert code == 0 and "created" in out and "annotation test per target group" in err
