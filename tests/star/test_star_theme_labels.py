"""Theme labelling's rules without a browser: agreement after normalisation, two distinct reviewers and a
third who settles, who sees which label when, labels keyed by their cluster's dialogues and carried over by
overlap when the map changes, the labels file read back as written, and the labels on a report's clusters.

The maps here are built by hand (points placed in clusters), so the rules are checked without UMAP; the web
tests build real maps.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from assay.errors import UserError
from assay.star import theme_labels
from assay.star.analysis.themes import (
    ClusterRow,
    SourceSize,
    ThemeMap,
    ThemePoint,
    cluster_key,
    cluster_summary,
    table_frame,
)
from assay.star.assign import add_instructions, create_campaign
from assay.star.spec import CampaignSpec
from assay.star.theme_labels import Reviewer, ThemeLabel, apply_labels
from assay.star.workflow import NotAllowed
from assay.store.engine import open_store
from assay.store.models import utcnow
from assay.store.star_models import StarCampaign, StarDialogue, StarTurn
from assay.store.star_web_models import StarThemeCluster, StarWebReport
from assay.store.web_models import WebUser

SPEC = {
    "name": "demo",
    "rules": [{"id": "plain", "text": "The model must stay polite.", "area": "misc"}],
    "templates": {"default": "Try: {{ rule.text }}"},
}
TOPICS = ["rifle ammunition", "cake flour", "mortgage loan"]


def hand_map(groups: list[list[str]], shift: float = 0.0) -> ThemeMap:
    """A map whose cluster ``c`` holds the dialogue ids ``groups[c]``, each cluster in its own corner."""
    points = [
        ThemePoint(dialogue_id=d, source="demo", x=10.0 * c + k + shift, y=float(k), cluster=c)
        for c, ids in enumerate(groups)
        for k, d in enumerate(ids)
    ]
    n = len(points)
    table = [
        ClusterRow(cluster=c, n=len(ids), counts={"demo": len(ids)}, shares={"demo": len(ids) / n})
        for c, ids in enumerate(groups)
    ]
    return ThemeMap(
        embedder="hand",
        n_neighbors=5,
        metric="cosine",
        seed=0,
        n_clusters=len(groups),
        per_source=n,
        n=n,
        points=points,
        table=table,
        terms={c: [(TOPICS[c % 3].split()[0], 1.0)] for c in range(len(groups))},
        n_by_source={"demo": SourceSize(original=n, sampled=n)},
        independence=None,
    )


# --- labels and clusters, without a database ------------------------------------------------------------


def test_labels_agree_after_normalisation_only() -> None:
    same = [
        "Weapons & hunting",
        "  weapons   &  HUNTING. ",
        "ｗｅａｐｏｎｓ & hunting!",
    ]  # NFKC folds full width
    assert {theme_labels.normalise(s) for s in same} == {"weapons & hunting"}
    assert theme_labels.normalise("weapons, hunting") != theme_labels.normalise("weapons & hunting")
    assert theme_labels.check_label("  two\n words ") == "two words"
    for bad in ("", " ... ", "x" * (theme_labels.MAX_LABEL + 1)):
        with pytest.raises(UserError, match="label"):
            theme_labels.check_label(bad)


def test_cluster_keys_follow_the_dialogues_not_the_numbers() -> None:
    first = cluster_summary(hand_map([["demo:1", "demo:2", "demo:3"], ["demo:4", "demo:5"]]))
    swapped = cluster_summary(hand_map([["demo:5", "demo:4"], ["demo:2", "demo:3", "demo:1"]], shift=3.0))
    assert {c["key"] for c in first} == {c["key"] for c in swapped}
    assert first[0]["key"] == swapped[1]["key"] == cluster_key(["demo:3", "demo:1", "demo:2"])
    assert first[0]["members"] == ["demo:1", "demo:2", "demo:3"] and first[0]["n"] == 3
    assert first[0]["samples"] == ["demo:2", "demo:1", "demo:3"]  # nearest the cluster's median first
    assert cluster_key(["demo:1", "demo:2"]) != cluster_key(["demo:1", "demo:2", "demo:3"])


def _clusters(*groups: list[str]) -> list[dict[str, object]]:
    return cluster_summary(hand_map([list(g) for g in groups]))


def test_labels_stay_with_their_cluster_and_carry_over_only_past_half_overlap() -> None:
    a, b = [f"demo:{i}" for i in range(1, 5)], [f"demo:{i}" for i in range(5, 9)]
    exact = ThemeLabel(key=cluster_key(a), label="weapons", decision="agreed", members=a)
    moved = ThemeLabel(key="old-b", label="baking", decision="settled", members=[*b[:3], "demo:99"])
    gone = ThemeLabel(key="old-c", label="loans", members=["demo:50", "demo:51"])
    match = apply_labels(_clusters(b, a), [exact, moved, gone])
    assert match.applied[1].label == "weapons" and match.applied[1].overlap == 1.0
    assert not match.applied[1].carried
    assert match.applied[0].label == "baking" and match.applied[0].carried
    assert match.applied[0].overlap == pytest.approx(3 / 5)  # Jaccard: 3 shared of 5 in either
    assert match.unmatched == [gone]
    half = ThemeLabel(key="old-h", label="half", members=b[:2])  # 2 of 4: exactly one half is not enough
    assert apply_labels(_clusters(b), [half]).applied == {}
    newer = moved.model_copy(update={"key": "newer-b", "label": "pastry"})  # same overlap: the later wins
    assert apply_labels(_clusters(b), [moved, newer]).applied[0].label == "pastry"
    without_members = ThemeLabel(key="old-b2", label="x")  # from a file without members: exact key only
    assert apply_labels(_clusters(b), [without_members]).unmatched == [without_members]


@settings(max_examples=60, deadline=None)
@given(
    assignment=st.lists(st.integers(0, 4), min_size=3, max_size=30),
    labelled=st.lists(st.sets(st.integers(0, 29), min_size=1), min_size=1, max_size=6),
)
def test_a_label_lands_on_one_cluster_at_most(assignment: list[int], labelled: list[set[int]]) -> None:
    """Over any partition into clusters, a label overlapping more than half lands on at most one."""
    groups = [[f"demo:{i}" for i, c in enumerate(assignment) if c == k] for k in sorted(set(assignment))]
    labels = [
        ThemeLabel(key=f"k{j}", label=f"l{j}", members=[f"demo:{i}" for i in m])
        for j, m in enumerate(labelled)
    ]
    match = apply_labels(_clusters(*groups), labels)
    sources = [a.source_key for a in match.applied.values()]
    assert len(sources) == len(set(sources))
    assert {lab.key for lab in match.unmatched}.isdisjoint(sources)
    assert len(sources) + len(match.unmatched) == len(labels)


def test_labels_file_round_trips_and_bad_rows_name_file_line_and_field(tmp_path: Path) -> None:
    labels = [
        ThemeLabel(key="0123abcd", label="Weapons, hunting", decision="agreed", members=["demo:1", "demo:2"]),
        ThemeLabel(key="4567ef01", label='Baking "at home"', decision="settled"),
    ]
    (tmp_path / "l.csv").write_text(theme_labels.labels_csv(labels), encoding="utf-8")
    (tmp_path / "l.json").write_text(theme_labels.labels_json(labels), encoding="utf-8")
    assert theme_labels.read_labels(tmp_path / "l.csv") == labels
    assert theme_labels.read_labels(tmp_path / "l.json") == labels
    plain = tmp_path / "plain.json"  # a bare list, decision left out
    plain.write_text(json.dumps([{"key": "0123abcd", "label": "Weapons"}]))
    assert theme_labels.read_labels(plain) == [ThemeLabel(key="0123abcd", label="Weapons", decision="given")]

    bad = tmp_path / "bad.csv"
    bad.write_text("key,label\n0123abcd,fine\n,empty key\n")
    with pytest.raises(UserError, match=r"bad\.csv:line 3: field 'key'"):
        theme_labels.read_labels(bad)
    bad.write_text("key,name\n0123abcd,fine\n")
    with pytest.raises(UserError, match=r"bad\.csv:line 2: field 'label' is missing"):
        theme_labels.read_labels(bad)
    bad.write_text("key,label,decision\n0123abcd,fine,voted\n")
    with pytest.raises(UserError, match=r"bad\.csv:line 2: field 'decision'.*'voted'"):
        theme_labels.read_labels(bad)


def test_a_reports_cluster_table_with_labels_filled_in_reads_back(tmp_path: Path) -> None:
    theme = hand_map([["demo:1", "demo:2"], ["demo:3", "demo:4", "demo:5"]])
    clusters = cluster_summary(theme)
    summary, names, rekeyed = theme_labels.for_report(
        clusters, [ThemeLabel(key="gone", label="hunting", members=["demo:3", "demo:4", "demo:5", "demo:6"])]
    )
    assert names == {1: "hunting"} and summary["labels"]["1"]["overlap"] == 0.75
    assert [lab.key for lab in rekeyed] == [clusters[1]["key"]]  # re-keyed to this map's cluster
    table = table_frame(theme, names)
    assert list(table["label"]) == ["", "hunting"] and list(table["key"]) == [c["key"] for c in clusters]
    table.loc[0, "label"] = "baking"  # a person fills in the unlabelled cluster
    table.to_csv(tmp_path / "themes_clusters.csv", index=False)
    back = theme_labels.read_labels(tmp_path / "themes_clusters.csv")
    assert apply_labels(clusters, back).applied[0].label == "baking"
    assert {c: a.label for c, a in apply_labels(clusters, back).applied.items()} == {
        0: "baking",
        1: "hunting",
    }
    assert "label" not in table_frame(theme).columns  # no labels given: the table as before


# --- the rules in the store -----------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> sessionmaker[Session]:
    """A campaign with six dialogues, six users (see ``people``) and a latest report whose map has clusters
    {1,2,3}, {4,5} and {6}; a second campaign for an outsider."""
    factory = open_store(f"sqlite:///{tmp_path / 'labels.db'}")
    with factory.begin() as session:
        campaign = create_campaign(session, CampaignSpec.model_validate(SPEC))
        create_campaign(session, CampaignSpec.model_validate(SPEC | {"name": "other"}))
        add_instructions(session, campaign, [{"id": "i1", "number": 1, "rule_id": "plain", "text": "t"}])
        instruction = campaign_instruction(session)
        for n in range(6):
            dialogue = StarDialogue(campaign_id=campaign.id, instruction_id=instruction, topic=TOPICS[n % 3])
            dialogue.turns = [StarTurn(index=0, role="user", text=f"tell me about {TOPICS[n % 3]} ({n})")]
            session.add(dialogue)
        for name in ("olga", "anna", "ben", "arno", "rita", "otto"):
            session.add(WebUser(username=name, password_hash="-", roles=[]))
        session.flush()
        store_map(session, [["demo:1", "demo:2", "demo:3"], ["demo:4", "demo:5"], ["demo:6"]])
    return factory


def campaign_instruction(session: Session) -> int:
    from assay.store.star_models import StarInstruction

    return session.scalars(select(StarInstruction.id)).one()


def store_map(session: Session, groups: list[list[str]]) -> list[str]:
    """Keep a report whose map has these clusters, as ``reporting.build_latest_report`` would; their keys."""
    theme = hand_map(groups)
    clusters = cluster_summary(theme)
    summary = {
        "themes": {
            "parameters": {"embedder": theme.embedder},
            "clusters": clusters,
            "terms": {str(c): [[t, w] for t, w in pairs] for c, pairs in theme.terms.items()},
        }
    }
    campaign = demo(session)
    row = session.scalar(select(StarWebReport).where(StarWebReport.campaign_id == campaign.id))
    if row is None:
        row = StarWebReport(campaign_id=campaign.id)
        session.add(row)
    row.html, row.summary, row.created_at = "<html></html>", summary, utcnow()
    session.flush()
    return [str(c["key"]) for c in clusters]


def demo(session: Session) -> StarCampaign:
    return session.scalars(select(StarCampaign).where(StarCampaign.name == "demo")).one()


def people(session: Session) -> dict[str, Reviewer]:
    """olga organises; anna and ben annotate and arno arbitrates in demo; rita red-teams in demo; otto
    annotates in the other campaign only."""
    ids = {u.username: u.id for u in session.scalars(select(WebUser))}
    camp = {c.name: c.id for c in session.scalars(select(StarCampaign))}

    def who(
        name: str, roles: tuple[str, ...], campaign: str | None = "demo", organiser: bool = False
    ) -> Reviewer:
        return Reviewer(
            ids[name], organiser, frozenset(roles), frozenset([camp[campaign]] if campaign else [])
        )

    return {
        "olga": who("olga", ("organiser",), None, organiser=True),
        "anna": who("anna", ("annotator",)),
        "ben": who("ben", ("annotator",)),
        "arno": who("arno", ("arbitrator",)),
        "rita": who("rita", ("red_teamer",)),
        "otto": who("otto", ("annotator",), "other"),
    }


def view(session: Session, person: Reviewer, key: str) -> theme_labels.ClusterView:
    board = theme_labels.board(session, demo(session), person)
    return next(c for c in board.clusters if c.key == key)


def test_two_reviewers_agree_after_normalisation_and_nobody_else_may_label(store) -> None:
    with store.begin() as session:
        p, campaign = people(session), demo(session)
        key = theme_labels.board(session, campaign, p["anna"]).clusters[0].key
        assert theme_labels.review(session, campaign, p["anna"], key, "Weapons & hunting") == "labelling"
        with pytest.raises(UserError, match="already"):  # final once given
            theme_labels.review(session, campaign, p["anna"], key, "something else")
        assert view(session, p["ben"], key).labels == []  # ben cannot see anna's label before giving his
        assert view(session, p["ben"], key).can_label
        assert theme_labels.review(session, campaign, p["ben"], key, "weapons &  HUNTING.") == "agreed"
        with pytest.raises(UserError, match="two reviewers"):
            theme_labels.review(session, campaign, p["olga"], key, "weapons")
        seen = view(session, p["arno"], key)
        assert (seen.status, seen.label, seen.labels) == (
            "agreed",
            "Weapons & hunting",
            ["Weapons & hunting", "weapons & HUNTING."],
        )
        assert not seen.can_label and not seen.can_settle
        assert theme_labels.agreed_labels(session, campaign) == [
            ThemeLabel(
                key=key, label="Weapons & hunting", decision="agreed", members=["demo:1", "demo:2", "demo:3"]
            )
        ]


def test_a_disagreement_is_settled_by_a_third_person_only(store) -> None:
    with store.begin() as session:
        p, campaign = people(session), demo(session)
        key = theme_labels.board(session, campaign, p["anna"]).clusters[1].key
        theme_labels.review(session, campaign, p["anna"], key, "baking")
        with pytest.raises(UserError, match="no disagreement"):  # one label is no disagreement yet
            theme_labels.settle(session, campaign, p["arno"], key, "baking")
        assert theme_labels.review(session, campaign, p["arno"], key, "cakes") == "disagreement"
        with pytest.raises(UserError, match="third reviewer"):  # arno labelled it: he may not settle it
            theme_labels.settle(session, campaign, p["arno"], key, "cakes")
        with pytest.raises(NotAllowed):  # ben labelled nothing here, but annotators never settle
            theme_labels.settle(session, campaign, p["ben"], key, "baking")
        assert view(session, p["ben"], key).labels == ["baking", "cakes"]  # both in: shown to all
        assert not view(session, p["ben"], key).can_settle and view(session, p["olga"], key).can_settle
        theme_labels.settle(session, campaign, p["olga"], key, "baking and cakes")
        with pytest.raises(UserError, match="no disagreement"):
            theme_labels.settle(session, campaign, p["olga"], key, "again")
        row = session.scalars(select(StarThemeCluster).where(StarThemeCluster.key == key)).one()
        assert (row.label, row.decision, row.decided_by) == ("baking and cakes", "settled", p["olga"].user_id)
        assert row.members == ["demo:4", "demo:5"]


def test_who_may_see_label_and_settle(store) -> None:
    with store.begin() as session:
        p, campaign = people(session), demo(session)
        board = theme_labels.board(session, campaign, p["arno"])
        assert board.may_settle and [c.n for c in board.clusters] == [3, 2, 1]
        sample = board.clusters[1].samples[0]  # typical dialogues come with their turns
        assert sample.dialogue_id in ("demo:4", "demo:5") and sample.turns[0][1].startswith("tell me about")
        assert not theme_labels.board(session, campaign, p["anna"]).may_settle
        for outsider in ("rita", "otto"):  # a red teamer here, an annotator of another campaign
            with pytest.raises(NotAllowed):
                theme_labels.board(session, campaign, p[outsider])
            with pytest.raises(NotAllowed):
                theme_labels.review(session, campaign, p[outsider], board.clusters[0].key, "x")
        with pytest.raises(UserError, match="not on the current map"):
            theme_labels.review(session, campaign, p["anna"], "0" * 16, "x")


def test_labels_outlive_a_changed_map_and_say_how(store) -> None:
    """The report is rebuilt with a seventh dialogue: unchanged clusters keep their labels, the grown one
    shows its old label as carried over, with the overlap; when the clusters then split apart, the labels
    are listed as not shown, not dropped."""
    with store.begin() as session:
        p, campaign = people(session), demo(session)
        keys = [c.key for c in theme_labels.board(session, campaign, p["anna"]).clusters]
        for key, label in zip(keys, ["weapons", "baking", "loans"], strict=True):
            for person in ("anna", "ben"):
                theme_labels.review(session, campaign, p[person], key, label)
        new = store_map(session, [["demo:1", "demo:2", "demo:3"], ["demo:4", "demo:5", "demo:7"], ["demo:6"]])
        assert new[0] == keys[0] and new[2] == keys[2] and new[1] != keys[1]
        board = theme_labels.board(session, campaign, p["anna"])
        assert [c.label for c in board.clusters] == ["weapons", None, "loans"]
        assert board.clusters[0].carried is None and board.unmatched == []
        grown = board.clusters[1]
        assert grown.status == "labelling" and grown.can_label and grown.n_labels == 0
        assert grown.carried is not None and grown.carried.label == "baking"
        assert grown.carried.overlap == pytest.approx(2 / 3)  # {4,5} of {4,5,7}
        store_map(session, [["demo:1", "demo:4"], ["demo:2", "demo:5"], ["demo:3", "demo:6"]])
        board = theme_labels.board(session, campaign, p["anna"])
        assert [c.carried for c in board.clusters] == [None, None, None]  # no overlap above one half
        assert {lab.label for lab in board.unmatched} == {"weapons", "baking", "loans"}


def test_no_map_no_clusters_and_the_reason(store) -> None:
    with store.begin() as session:
        p, campaign = people(session), demo(session)
        report = session.scalars(select(StarWebReport)).one()
        report.summary = {"themes": {"skipped": "no embedder chosen"}}
        session.flush()
        board = theme_labels.board(session, campaign, p["olga"])
        assert board.clusters == [] and "no thematic map (no embedder chosen)" in board.reason
        with pytest.raises(UserError, match="no thematic map"):
            theme_labels.review(session, campaign, p["olga"], "0" * 16, "x")
