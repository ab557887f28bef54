"""assay.star.spec: the example campaign, target groups, template checks and one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from jinja2.exceptions import SecurityError, UndefinedError

from assay.errors import UserError
from assay.star.spec import AnnotationArms, CampaignSpec, group_label, load_spec, render

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "star-campaign.yaml"


def test_example_spec_and_groups() -> None:
    spec = load_spec(EXAMPLE)
    groups = spec.demographics.groups()
    assert len(groups) == 3 + 4 + 3 * 4  # genders, races, and every race x gender pair
    assert {"race": "Asian", "gender": "male"} in groups
    assert group_label({"race": "Asian", "gender": "male"}) == "gender=male & race=Asian"
    assert [r.id for r in spec.rules if r.targets_groups] == ["hate", "stereotypes"]
    assert spec.rule("medical").expertise == ["medical"]
    assert spec.is_broken(0) and spec.is_broken(1) and not spec.is_broken(2)
    with pytest.raises(UserError, match="unknown rule 'nope'"):
        spec.rule("nope")


def test_render_is_sandboxed_and_strict() -> None:
    spec = load_spec(EXAMPLE)
    context = {
        "rule": spec.rules[0],
        "group": {},
        "group_text": "",
        "use_case": "entertainment",
        "adversariality": "low",
    }
    text = render(spec.templates["default"], context)
    assert spec.rules[0].text in text and "ordinary user" in text and "  " not in text
    with pytest.raises((SecurityError, UndefinedError)):
        render("{{ rule.__class__.__init__.__globals__ }}", context)
    with pytest.raises(UndefinedError):
        render("{{ missing }}", context)


def _write(tmp_path: Path, change) -> Path:
    raw = yaml.safe_load(EXAMPLE.read_text())
    change(raw)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        (lambda r: r["templates"].update(x="{{ mood }}"), "(top level)", "refers to 'mood'"),
        (lambda r: r["templates"].update(x="{% if %}"), "(top level)", "template 'x' line 1"),
        (lambda r: r["rules"].append(dict(r["rules"][0])), "rules.3.id", "repeats the id of rules.0"),
        (lambda r: r.update(colour="red"), "colour", "Extra inputs"),
        (lambda r: r.update(arbitration_gap=4), "(top level)", "wider than the scale"),
        (lambda r: r["demographics"]["attributes"]["race"].append("Asian"), "demographics", "twice"),
        (lambda r: r["demographics"].update(attributes={"race": ["Asian"]}), "demographics", "two-way"),
        (lambda r: r["demographics"].update(attributes={}), "(top level)", "a rule targets groups"),
        (lambda r: r.update(in_group_share=1.5), "in_group_share", "less than or equal to 1"),
        (
            lambda r: r.update(annotation_arms="half"),
            "annotation_arms",
            "unknown preset 'half' (presets: paper",
        ),
        (
            lambda r: r.update(annotation_arms={"in_group": 0.5, "both": 0.2}),
            "annotation_arms",
            "add up to 1",
        ),
        (lambda r: r.update(annotation_arms={"in": 1}), "annotation_arms.in", "Extra inputs"),
        (lambda r: r.update(out_group_annotation_share=0.2), "(top level)", "not both"),
        (lambda r: r["power"].update(difference=0.1), "power", "odds_ratio or difference, not both"),
        (lambda r: r["power"].update(odds_ratio=None, difference=0.8), "power", "is not a share"),
        (lambda r: r["power"].update(icc=1.5), "power.icc", "less than or equal to 1"),
    ],
)
def test_bad_specs_are_one_line(tmp_path: Path, change, field: str, words: str) -> None:
    path = _write(tmp_path, change)
    with pytest.raises(UserError) as info:
        load_spec(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}: field '{field}'") and words in message


def test_unreadable_and_invalid_yaml(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="cannot read"):
        load_spec(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules: [\n")
    with pytest.raises(UserError, match=r"bad\.yaml:\d+: not valid YAML"):
        load_spec(bad)


def test_spec_without_demographics_loads(tmp_path: Path) -> None:
    def change(raw: dict) -> None:
        raw.pop("demographics")
        raw["rules"] = [r for r in raw["rules"] if not r.get("targets_groups")]

    spec = load_spec(_write(tmp_path, change))
    assert spec.demographics.groups() == [] and [r.id for r in spec.rules] == ["medical"]


def test_annotation_arms_presets_mappings_and_the_older_share() -> None:
    """The example uses the paper's preset; a mapping gives any shares; the older
    ``out_group_annotation_share: s`` (specs and stored campaigns before the arms) reads as in-group
    ``1 - s`` and both ``s``, and a campaign stored that way equals the same spec written with arms."""
    from fractions import Fraction

    spec = load_spec(EXAMPLE)
    assert spec.annotation_arms == AnnotationArms(in_group=0.59, out_group=0.24, both=0.17)
    assert spec.annotation_arms.shares() == (Fraction(59, 100), Fraction(24, 100), Fraction(17, 100))
    raw = {k: v for k, v in spec.model_dump().items() if k != "annotation_arms"}
    old = CampaignSpec.model_validate({**raw, "out_group_annotation_share": 0.2})
    new = CampaignSpec.model_validate({**raw, "annotation_arms": {"in_group": 0.8, "both": 0.2}})
    assert old == new and old.annotation_arms.shares() == (Fraction(4, 5), 0, Fraction(1, 5))
    assert CampaignSpec.model_validate(raw).annotation_arms.in_group == 1.0  # the default: in-group only
    thirds = AnnotationArms(in_group=0.333, out_group=0.333, both=0.334).shares()
    assert sum(thirds) == 1 and thirds[0] == Fraction(333, 1000)
    assert spec.power.odds_ratio == 2.0 and spec.in_group_fraction() == Fraction(1, 2)
