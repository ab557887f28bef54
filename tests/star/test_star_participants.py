"""STAR participant pools: CSV/YAML import against the spec, one-line errors, upsert, membership rules."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from assay.errors import UserError
from assay.star.assign import create_campaign
from assay.star.participants import blank_attributes, group_attributes, import_pool, load_pool, membership
from assay.star.spec import PREFER_NOT_TO_SAY, CampaignSpec, load_spec
from assay.store import StarParticipant, open_store

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "star-campaign.yaml"
HEADER = "id,name,roles,expertise,race,gender,daily_cap,opted_out\n"


@pytest.fixture
def spec():
    return load_spec(EXAMPLE)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_csv_pool_reads_lists_defaults_and_spelling(tmp_path: Path, spec) -> None:
    path = write(
        tmp_path,
        "pool.csv",
        HEADER
        + "p1,Ada,red_teamer;Annotator,medical; law ,asian;White,female,5,yes\n"
        + "p2,,red teamer,,prefer not to say,,,\n",
    )
    first, second = load_pool(path, spec)
    assert first.roles == ["red_teamer", "annotator"] and first.expertise == ["medical", "law"]
    assert first.demographics == {"race": ["Asian", "White"], "gender": ["female"]}
    assert (first.daily_cap, first.opted_out) == (5, True)
    assert second.name == "p2" and second.demographics == {"race": [PREFER_NOT_TO_SAY]}
    assert (second.daily_cap, second.opted_out) == (20, False)


@pytest.mark.parametrize(
    ("row", "field", "value"),
    [
        ("p1,A,red_teamer,,Martian,female,,", "race", "Martian"),
        ("p1,A,pilot,,Asian,female,,", "roles", "pilot"),
        ("p1,A,,,Asian,female,,", "roles", ""),
        ("p1,A,annotator,,Asian,female,0,", "daily_cap", "0"),
        ("p1,A,annotator,,Asian,female,many,", "daily_cap", "many"),
        ("p1,A,annotator,,Asian,female,3,maybe", "opted_out", "maybe"),
        ("p1,A,annotator,,Asian;prefer not to say,female,,", "race", "Asian;prefer not to say"),
        (",A,annotator,,Asian,female,,", "id", ""),
    ],
)
def test_csv_errors_name_file_line_field_and_value(tmp_path: Path, spec, row: str, field: str, value) -> None:
    path = write(tmp_path, "pool.csv", HEADER + "ok,B,annotator,,Black,male,,\n" + row + "\n")
    with pytest.raises(UserError) as info:
        load_pool(path, spec)
    message = str(info.value)
    assert message.startswith(f"{path}:3: field '{field}'") and repr(value) in message
    assert "\n" not in message


def test_unknown_column_and_repeated_id(tmp_path: Path, spec) -> None:
    path = write(tmp_path, "pool.csv", "id,roles,religion\np1,annotator,none\n")
    with pytest.raises(UserError, match=r"pool\.csv:2: field 'religion' is not a known column"):
        load_pool(path, spec)
    path = write(tmp_path, "pool.csv", HEADER + "p1,A,annotator,,,,,\np1,B,annotator,,,,,\n")
    with pytest.raises(UserError, match=r"pool\.csv:3: field 'id' repeats the id on line 2"):
        load_pool(path, spec)


def test_yaml_pool_and_its_error_lines(tmp_path: Path, spec) -> None:
    good = (
        "- id: p1\n  roles: [annotator, arbitrator]\n  race: [Asian, Black]\n  gender: male\n  daily_cap: 3\n"
    )
    (person,) = load_pool(write(tmp_path, "pool.yaml", good), spec)
    assert person.roles == ["annotator", "arbitrator"] and person.demographics["race"] == ["Asian", "Black"]
    bad = good + "- id: p2\n  roles: annotator\n  gender: robot\n"
    with pytest.raises(UserError) as info:
        load_pool(write(tmp_path, "pool.yaml", bad), spec)
    assert str(info.value).startswith(f"{tmp_path / 'pool.yaml'}:8: field 'gender'") and "'robot'" in str(
        info.value
    )
    with pytest.raises(UserError, match="list of mappings"):
        load_pool(write(tmp_path, "pool.yaml", "id: p1\n"), spec)


def test_import_upserts_by_external_id(tmp_path: Path, spec) -> None:
    sessions = open_store(f"sqlite:///{tmp_path / 'star.db'}")
    first = write(
        tmp_path, "a.csv", HEADER + "p1,A,annotator,,Asian,female,,\np2,B,red_teamer,,Black,male,,\n"
    )
    second = write(
        tmp_path, "b.csv", HEADER + "p1,A,annotator,medical,Asian,female,7,true\np3,C,annotator,,,,,\n"
    )
    with sessions.begin() as session:
        campaign = create_campaign(session, spec)
        summary = import_pool(session, campaign, first)
        assert (summary.added, summary.updated) == (2, 0)
    with sessions.begin() as session:
        summary = import_pool(session, campaign, second)
        assert (summary.added, summary.updated) == (1, 1)
        again = import_pool(session, campaign, second)
        assert (again.added, again.updated) == (0, 0)
    with sessions() as session:
        people = {p.external_id: p for p in session.scalars(select(StarParticipant))}
    assert sorted(people) == ["p1", "p2", "p3"]
    assert people["p1"].expertise == ["medical"] and people["p1"].daily_cap == 7 and people["p1"].opted_out


@pytest.mark.parametrize(
    ("declared", "group", "expected"),
    [
        ({"race": ["Asian"], "gender": ["male"]}, {"race": "Asian", "gender": "male"}, True),
        ({"race": ["Asian", "White"]}, {"race": "White"}, True),
        ({"race": ["Asian"], "gender": ["male"]}, {"race": "Asian", "gender": "female"}, False),
        ({"race": ["Black"]}, {"race": "Asian", "gender": "male"}, False),  # one declared mismatch suffices
        ({"race": ["Asian"]}, {"race": "Asian", "gender": "male"}, None),  # gender undeclared: unknown
        ({"race": ["Asian"], "gender": [PREFER_NOT_TO_SAY]}, {"race": "Black", "gender": "male"}, None),
        ({"race": ["Asian"], "gender": [PREFER_NOT_TO_SAY]}, {"race": "Asian"}, True),  # usable elsewhere
        ({}, {"race": "Asian"}, None),
        ({"race": ["Asian"]}, None, None),
    ],
)
def test_membership_rules(declared, group, expected) -> None:
    assert membership(declared, group) is expected


def test_participants_are_exported_and_reported_as_counts_never_as_people(tmp_path: Path, spec) -> None:
    """The export's participants table has no id or name; the report counts roles, declared values,
    expertise, tasks and hours over the people who took part, and names nobody."""
    from datetime import UTC, datetime, timedelta

    import pandas as pd

    from assay.star.analysis.participants_summary import participants_summary
    from assay.star.analysis.report import build_report, render_html
    from assay.star.assign import add_instructions, claim_next, submit_annotation, submit_dialogue
    from assay.star.exchange import COLUMNS, campaign_tables

    pool = write(
        tmp_path,
        "pool.csv",
        HEADER
        + "p1,Ada Quill,red_teamer,,Asian,female,,\n"
        + "p2,Bo Rask,annotator,medical,Black;White,male,,\n"
        + "p3,Cy Dunmore,annotator;arbitrator,medical,prefer not to say,female,,\n"
        + "p4,Di Voss,annotator,medical,White,,,yes\n",
    )
    sessions = open_store(f"sqlite:///{tmp_path / 'star.db'}")
    now = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
    with sessions.begin() as session:
        campaign = create_campaign(session, spec)
        import_pool(session, campaign, pool)
        ids = dict(session.execute(select(StarParticipant.external_id, StarParticipant.id)).tuples().all())
        add_instructions(
            session, campaign, [{"id": "ins-00001", "number": 1, "rule_id": "medical", "text": "x"}]
        )
    red = claim_next(sessions, ids["p1"], "red_team", now=now)
    with sessions.begin() as session:
        submit_dialogue(
            session, red, "topic", [("user", "hi"), ("assistant", "no")], "m", now=now + timedelta(hours=3)
        )
    for person, minutes in (("p2", 30), ("p3", 15)):
        task = claim_next(sessions, ids[person], "annotate", now=now + timedelta(hours=4))
        submit_annotation(sessions, task, 1, "fine", now=now + timedelta(hours=4, minutes=minutes))
    with sessions() as session:
        rows = campaign_tables(session, session.get_one(type(campaign), campaign.id))["participants"]
    assert [tuple(row) for row in rows] == [COLUMNS["participants"]] * 4  # no id, no name
    assert sorted((r["red_team_tasks"], r["annotate_tasks"], r["hours"]) for r in rows) == [
        (0, 0, 0.0),
        (0, 1, 0.25),
        (0, 1, 0.5),
        (1, 0, 3.0),
    ]
    summary = participants_summary(pd.DataFrame(rows), spec)
    assert (summary.pool, summary.took_part, summary.opted_out) == (4, 3, 1)
    assert summary.roles == {"red_teamer": 1, "annotator": 2, "arbitrator": 1}
    assert summary.demographics == {
        "race": {"Asian": 1, "Black": 1, "White": 1, PREFER_NOT_TO_SAY: 1},  # Bo declared two values
        "gender": {"female": 2, "male": 1},
    }
    assert summary.expertise == {"medical": 2, "none": 1}
    assert summary.tasks["red_team"]["1"] == 1 and summary.tasks["annotate"]["1"] == 2
    assert summary.hours == {
        "under 1 h": 2,
        "1-2 h": 0,
        "2-5 h": 1,
        "5-10 h": 0,
        "10-20 h": 0,
        "20 h or more": 0,
    }
    assert (summary.total_hours, summary.median_tasks, summary.median_hours) == (3.75, 1.0, 0.5)
    with sessions() as session:
        tables = campaign_tables(session, session.get_one(type(campaign), campaign.id))
    report = build_report(spec, {k: pd.DataFrame(v) for k, v in tables.items()}, n_boot=10)
    assert report.summary["participants"] == summary.model_dump(mode="json")
    assert list(report.tables["participants"].columns) == ["section", "category", "people"]
    html = render_html(report, spec)
    section = html[html.index('id="participants"') : html.index("<h2>Files</h2>")]
    assert "4 people in the pool, 3 of them" in section and '<td class="l">Black</td><td>1</td>' in section
    names = ("Ada", "Quill", "Bo Rask", "Cy", "Dunmore", "Voss", "p1", "p2", "p3", "p4")
    assert not [n for n in names if n in section or n in str(report.summary["participants"])]


def test_only_the_attributes_the_target_groups_need_are_required(tmp_path: Path, spec) -> None:
    """A column is required for an attribute the target groups are drawn over, and for nothing else: a spec
    whose intersections use race alone needs no gender, and one whose rules target no group needs neither."""
    raw = spec.model_dump()
    race_only = CampaignSpec.model_validate(
        raw | {"demographics": {**raw["demographics"], "intersections": ["race"]}}
    )
    no_groups = CampaignSpec.model_validate(
        raw | {"rules": [{**rule, "targets_groups": False} for rule in raw["rules"]]}
    )
    assert group_attributes(spec) == ["race", "gender"] and group_attributes(race_only) == ["race"]
    assert group_attributes(no_groups) == []
    path = write(tmp_path, "pool.csv", "id,roles,race\np1,annotator,Asian\np2,annotator,\n")
    with pytest.raises(
        UserError, match=r"pool\.csv:1: field 'gender' is missing: the campaign's target groups"
    ):
        load_pool(path, spec)
    people = load_pool(path, race_only)
    (blank,) = blank_attributes(path, people, race_only)
    assert blank.startswith(f"{path}:3: p2 (p2) declares no 'race'")
    assert len(load_pool(write(tmp_path, "bare.csv", "id,roles\np1,annotator\n"), no_groups)) == 1
