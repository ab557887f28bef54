"""One rule for the names people choose (users, teams, campaigns), held at every door."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from assay.errors import UserError
from assay.leaderboard import rounds
from assay.leaderboard.cli import app as leaderboard_cli
from assay.star.spec import load_spec
from assay.store import open_store
from assay.web import accounts

HOSTILE = ["<script>", 'a"b', "a b", "", "-lead", "x" * 65, "tab\there", "é"]
FINE = ["alpha", "Team-2", "r1.v2", "a", "x" * 64]
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "star-campaign.yaml"


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_names_are_refused_for_teams_users_and_campaigns(name: str, tmp_path: Path) -> None:
    sessions = open_store(f"sqlite:///{tmp_path / 'names.db'}")
    with sessions.begin() as session:
        with pytest.raises(UserError, match="invalid: use"):
            rounds.add_team(session, name)
        with pytest.raises(UserError, match="invalid: use"):
            accounts.create_user(session, name, "a long enough password", ["viewer"])
    spec = yaml.safe_load(EXAMPLE.read_text())
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({**spec, "name": name}))
    with pytest.raises(UserError, match="name"):
        load_spec(tmp_path / "c.yaml")


@pytest.mark.parametrize("name", FINE)
def test_ordinary_names_pass_everywhere(name: str, tmp_path: Path) -> None:
    sessions = open_store(f"sqlite:///{tmp_path / 'names.db'}")
    with sessions.begin() as session:
        assert rounds.add_team(session, name).name == name
        if len(name) >= 3:
            assert accounts.create_user(session, name.lower(), "a long enough password", ["viewer"]).username
    spec = yaml.safe_load(EXAMPLE.read_text())
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({**spec, "name": name}))
    assert load_spec(tmp_path / "c.yaml").name == name


def test_the_command_line_refuses_a_script_tag_as_a_team_in_one_line(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ASSAY_DB_URL", f"sqlite:///{tmp_path / 'cli.db'}")
    result = CliRunner().invoke(leaderboard_cli, ["team", "add", "<script>alert(1)</script>"])
    assert isinstance(result.exception, UserError)
    assert str(result.exception).startswith("team name '<script>alert(1)</script>' invalid")
