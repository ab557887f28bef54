"""``assay serve`` (run the web app with uvicorn) and ``assay user`` (accounts from the shell).

Passwords never come from the command line (it shows in ``ps`` and shell history): ``--password-file``, the
``ASSAY_PASSWORD`` environment variable, or a hidden prompt when run in a terminal. FastAPI and uvicorn are
imported inside ``serve`` so the rest of the CLI starts fast.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from assay.config import settings
from assay.errors import UserError
from assay.store.engine import open_store
from assay.web import accounts

app = typer.Typer(
    help="Web accounts: add users, list them, issue API tokens.\n\n"
    "Example: ASSAY_PASSWORD=... assay user add alice --role organiser",
    no_args_is_help=True,
)
console = Console(soft_wrap=True)


def serve(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8000, "--port", min=1, max=65535, help="Port to listen on."),
    db: str | None = typer.Option(None, "--db", help="Database URL (default: ASSAY_DB_URL or ASSAY_HOME)."),
    secure_cookies: bool = typer.Option(
        False, "--secure-cookies", help="Mark the session cookie Secure (serve over HTTPS)."
    ),
) -> None:
    """Run the web application (pages and the JSON API under /api/v1).

    Example: assay serve --port 8000   (then: assay user add alice --role organiser)
    """
    import uvicorn

    from assay.web.app import create_app

    web = create_app(db or settings().database_url, secure_cookies=secure_cookies)
    uvicorn.run(web, host=host, port=port, proxy_headers=True)


@app.callback()
def user() -> None:
    """Web accounts: add users, list them, issue API tokens."""


def read_password(password_file: Path | None) -> str:
    """From the file (first line), else ``ASSAY_PASSWORD``, else a hidden prompt in a terminal."""
    if password_file is not None:
        try:
            lines = password_file.read_text(encoding="utf-8").splitlines()
        except OSError as err:
            raise UserError(f"{password_file}: cannot read the password file ({err.strerror})") from err
        return lines[0] if lines else ""
    if os.environ.get("ASSAY_PASSWORD"):
        return os.environ["ASSAY_PASSWORD"]
    if sys.stdin.isatty():
        return str(typer.prompt("Password", hide_input=True, confirmation_prompt=True))
    raise UserError("no password: give --password-file FILE or set ASSAY_PASSWORD")


@app.command("add")
def add(
    username: str = typer.Argument(..., help="3-64 characters of a-z, 0-9, '_', '.', '-'."),
    role: list[str] = typer.Option(
        ..., "--role", "-r", help=f"Role (repeatable): {', '.join(accounts.ROLES)}."
    ),
    team: str | None = typer.Option(None, "--team", help="Leaderboard team, for team members."),
    display_name: str = typer.Option("", "--display-name", help="Name shown on pages."),
    password_file: Path | None = typer.Option(None, "--password-file", help="File whose first line is it."),
    db: str | None = typer.Option(None, "--db", help="Database URL (default: ASSAY_DB_URL or ASSAY_HOME)."),
) -> None:
    """Add a web user.

    Example: ASSAY_PASSWORD=... assay user add alice --role organiser
    """
    password = read_password(password_file)
    with open_store(db).begin() as session:
        created = accounts.create_user(
            session, username, password, role, accounts.find_team(session, team or ""), display_name
        )
        console.print(f"added user [bold]{created.username}[/] ({', '.join(created.roles)})", highlight=False)


@app.command("list")
def list_users(
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    db: str | None = typer.Option(None, "--db", help="Database URL (default: ASSAY_DB_URL or ASSAY_HOME)."),
) -> None:
    """List web users and their roles.

    Example: assay user list --json
    """
    with open_store(db).begin() as session:
        rows = [
            {
                "username": u.username,
                "display_name": u.display_name,
                "roles": list(u.roles),
                "team": u.team.name if u.team else None,
                "disabled": u.disabled,
            }
            for u in accounts.list_users(session)
        ]
    if json_out:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table("username", "name", "roles", "team", "status")
    for row in rows:
        status = "disabled" if row["disabled"] else "active"
        table.add_row(
            row["username"], row["display_name"], ", ".join(row["roles"]), row["team"] or "", status
        )
    console.print(table)


@app.command("token")
def token(
    username: str = typer.Argument(..., help="Whose token."),
    name: str = typer.Option(..., "--name", help="What the token is for, e.g. 'ci'."),
    db: str | None = typer.Option(None, "--db", help="Database URL (default: ASSAY_DB_URL or ASSAY_HOME)."),
) -> None:
    """Print a new API token for USERNAME (shown once; use it as `Authorization: Bearer TOKEN`).

    Example: assay user token alice --name ci
    """
    with open_store(db).begin() as session:
        found = accounts.get_user(session, username)
        if found is None:
            raise UserError(f"no web user '{username}': see `assay user list`")
        raw = accounts.create_api_token(session, found, name)
    typer.echo(raw)
