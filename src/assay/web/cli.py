"""``assay serve`` (run the web app with uvicorn) and ``assay user`` (accounts from the shell).

Passwords never come from the command line (it shows in ``ps`` and shell history): ``--password-file``, the
``ASSAY_PASSWORD`` environment variable, or a hidden prompt when run in a terminal. FastAPI and uvicorn are
imported inside ``serve`` so the rest of the CLI starts fast.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from assay.errors import UserError
from assay.store.enums import Role
from assay.terminal import plain_table

if TYPE_CHECKING:
    from rich.console import Console

app = typer.Typer(
    help="Web accounts: add, list, disable or enable users, set passwords, issue API tokens.\n\n"
    "Example: ASSAY_PASSWORD=... assay user add alice --role organiser",
    no_args_is_help=True,
)
serve_app = typer.Typer(add_completion=False)  # `assay serve`: one command, mounted by the root
Who = Annotated[str, typer.Argument(help="Who.")]


@functools.cache
def console() -> Console:
    """rich's console, imported when a command prints through it: 0.07 s that `user list` does without."""
    from rich.console import Console

    return Console(soft_wrap=True)


DbUrl = Annotated[
    str | None, typer.Option("--db", help="Database URL (default: ASSAY_DB_URL or ASSAY_HOME).")
]


@serve_app.command("serve")
def serve(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8000, "--port", min=1, max=65535, help="Port to listen on."),
    db: DbUrl = None,
    secure_cookies: bool = typer.Option(
        False, "--secure-cookies", help="Mark the session cookie Secure (serve over HTTPS)."
    ),
    demo: bool = typer.Option(
        False, "--demo", help="Seed an empty database with a demo round, campaign, release and accounts."
    ),
    target: str | None = typer.Option(
        None, "--target", help="With --demo: the campaign's target model (default: the bundled SmolLM2)."
    ),
    workers: int = typer.Option(
        1, "--workers", min=1, max=64, help="Worker processes; use PostgreSQL for more than one."
    ),
    warm_models: bool = typer.Option(
        False,
        "--warm-models",
        help="Load the STAR campaigns' target models at start, in the background, so no red teamer's "
        "first reply waits minutes for one (each worker process holds its own).",
    ),
    public_url: str | None = typer.Option(
        None,
        "--public-url",
        help="The address users reach the site at (default: ASSAY_PUBLIC_URL; with --demo: "
        "http://HOST:PORT). Invitation and reset links are built from it, never from the Host header.",
    ),
    log_format: str | None = typer.Option(
        None, "--log-format", help="text or json: one JSON object a line (default: ASSAY_LOG_FORMAT or text)."
    ),
    forwarded_allow_ips: str | None = typer.Option(
        None,
        "--forwarded-allow-ips",
        help="Proxies whose X-Forwarded-For and X-Forwarded-Proto are believed: addresses or networks, "
        "comma-separated, or '*' (default: FORWARDED_ALLOW_IPS, else 127.0.0.1,::1). Behind a proxy, name "
        "it, or the sign-in throttle and the logs see every user as the proxy (docs/deploy.md).",
    ),
) -> None:
    """Run the web application (pages and the JSON API under /api/v1).

    Example: assay serve --port 8000   (then: assay user add alice --role organiser)
    Example: ASSAY_HOME=demo-home assay serve --demo   (prints one password per role)
    Example: ASSAY_DB_URL=postgresql+psycopg://assay@db/assay assay serve --workers 4
    """
    import uvicorn

    from assay.config import settings
    from assay.web import logs
    from assay.web.app import SECURE_COOKIES_ENV, WARM_MODELS_ENV, create_app

    os.environ["ASSAY_LOG_FORMAT"] = logs.check_format(log_format or settings().log_format)
    log = {"log_config": logs.uvicorn_log_config(settings().log_format, settings().log_level)}
    log["access_log"] = settings().log_format != "json"  # JSON access records come from assay.web.metrics
    logs.configure(settings().log_format, settings().log_level)
    url = db or settings().database_url
    public_url = public_url or settings().public_url or (f"http://{host}:{port}" if demo else None)
    if warm_models:  # the worker processes of --workers read it too
        os.environ[WARM_MODELS_ENV] = "1"
    web = create_app(
        url, secure_cookies=secure_cookies, public_url=public_url, warm_models=warm_models
    )  # migrates before workers start
    if demo:
        _seed_demo(web.state.sessions, target)
    if workers == 1:
        uvicorn.run(web, host=host, port=port, **proxy_options(forwarded_allow_ips), **log)
        return
    if url.startswith("sqlite"):
        console().print("note: several workers on SQLite share one write lock; PostgreSQL scales further")
    if db is not None:  # else the workers read ASSAY_DB_URL or ASSAY_DB_URL_FILE as this process did
        os.environ["ASSAY_DB_URL"] = db
        os.environ.pop("ASSAY_DB_URL_FILE", None)
    _share_metrics()
    os.environ[SECURE_COOKIES_ENV] = "1" if secure_cookies else "0"
    if web.state.public_url:
        os.environ["ASSAY_PUBLIC_URL"] = web.state.public_url
    web.state.sessions.kw["bind"].dispose()  # no connection of this process is inherited by a worker
    factory = "assay.web.app:app_from_env"
    proxies = proxy_options(forwarded_allow_ips)
    uvicorn.run(factory, factory=True, workers=workers, host=host, port=port, **proxies, **log)


def proxy_options(forwarded_allow_ips: str | None) -> dict[str, Any]:
    """uvicorn's options for forwarded addresses. The client address the sign-in throttle counts and the
    access log shows is the connection's, unless it comes from a trusted proxy: then it is the one that
    proxy puts in X-Forwarded-For. None leaves the list to uvicorn (``FORWARDED_ALLOW_IPS``, else loopback),
    so a proxy in front of a container, whose address is not loopback, must be named."""
    return {"proxy_headers": True, "forwarded_allow_ips": forwarded_allow_ips}


def _share_metrics() -> None:
    """Give the worker processes one fresh folder for their request metrics (prometheus_client's multiprocess
    mode), so a scrape answered by any worker sums them all; removed when the server stops."""
    import atexit
    import shutil
    import tempfile

    from assay.web.metrics import MULTIPROCESS_ENV

    if os.environ.get(MULTIPROCESS_ENV):  # the operator's own folder: theirs to keep
        return
    folder = tempfile.mkdtemp(prefix="assay-metrics-")
    os.environ[MULTIPROCESS_ENV] = folder
    atexit.register(shutil.rmtree, folder, ignore_errors=True)


def _demo_round(folder: Path) -> Path:
    """A real 8-model digits round (half trojaned), split 50/25/25: under a minute on 2 cores, made once."""
    from assay.zoo.config import RoundConfig
    from assay.zoo.round import generate_round
    from assay.zoo.split import split_round

    splits = folder / "splits"
    if not (splits / "split.json").exists():
        config = {"models": 8, "seed": 5, "architectures": ["mlp"], "widths": [8], "epochs": 6}
        config |= {"source_specific_share": 0.0, "clean_accuracy_floor": 0.6, "asr_floor": 0.6}
        generate_round(RoundConfig.model_validate(config), folder, workers=1)
        split_round(folder, {"train": 0.5, "test": 0.25, "holdout": 0.25}, seed=1)
    return splits


def _seed_demo(sessions: Any, target: str | None) -> None:
    """Seed (once) and print who can sign in with what."""
    from assay.assets import asset_path
    from assay.config import settings
    from assay.web import accounts
    from assay.web.demo import demo_roles, seed_demo

    home = settings().home / "demo"
    with sessions() as session:
        if accounts.list_users(session)[1]:
            console().print("--demo: the database already has users; serving it as it is", highlight=False)
            return
    if target is None:
        try:
            target = f"hf:{asset_path('smollm2')}"
        except UserError:
            target = ""
    console().print("--demo: training a small zoo round for the leaderboard (once) ...", highlight=False)
    seeded = seed_demo(sessions, home, round_dir=_demo_round(home / "round"), target_model=target)
    from rich.table import Table

    table = Table("username", "roles", "password")
    for name, password in seeded.passwords.items():
        table.add_row(name, ", ".join(demo_roles(name)), password)
    console().print(table)
    for note in seeded.notes:
        console().print(f"note: {note}", highlight=False)
    console().print(f"DyePack demo key (for a verification run): {seeded.dyepack_key}", highlight=False)


@app.callback()
def user() -> None:
    """Web accounts: add, list, disable or enable users, set passwords, issue API tokens."""


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
    role: list[str] = typer.Option(..., "--role", "-r", help=f"Role (repeatable): {', '.join(Role)}."),
    team: str | None = typer.Option(None, "--team", help="Leaderboard team, for team members."),
    display_name: str = typer.Option("", "--display-name", help="Name shown on pages."),
    password_file: Path | None = typer.Option(None, "--password-file", help="File whose first line is it."),
    db: DbUrl = None,
) -> None:
    """Add a web user.

    Example: ASSAY_PASSWORD=... assay user add alice --role organiser
    """
    from assay.store.engine import open_store  # here, not at import: `assay user --help` stays light
    from assay.web import accounts

    password = read_password(password_file)
    with open_store(db).begin() as session:
        created = accounts.create_user(
            session, username, password, role, accounts.find_team(session, team or ""), display_name
        )
        console().print(
            f"added user [bold]{created.username}[/] ({', '.join(created.roles)})", highlight=False
        )


@app.command("list")
def list_users(
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    limit: int = typer.Option(100, "--limit", min=1, max=500, help="How many users at most."),
    offset: int = typer.Option(0, "--offset", min=0, help="How many to skip (by username)."),
    db: DbUrl = None,
) -> None:
    """List web users and their roles, by username, a page at a time.

    Example: assay user list --json --limit 50 --offset 50
    """
    from assay.store import fastread

    rows, total = fastread.users_page(db or fastread.database_url(), limit, offset) or _users_page(
        db, limit, offset
    )
    if json_out:
        typer.echo(json.dumps(rows, indent=2))
        return
    lines = [
        (row["username"], row["display_name"], ", ".join(row["roles"]), row["team"] or "", status)
        for row in rows
        for status in ["disabled" if row["disabled"] else "active"]
    ]
    typer.echo(plain_table(("username", "name", "roles", "team", "status"), lines))
    typer.echo(f"users {offset + 1 if rows else 0}-{offset + len(rows)} of {total}")


def _users_page(db: str | None, limit: int, offset: int) -> tuple[list[dict[str, Any]], int]:
    """``user list``'s page through the ORM: the path that creates or upgrades the database first."""
    from assay.store.engine import open_store  # here, not at import: `assay user --help` stays light
    from assay.store.paging import Window
    from assay.web import accounts

    with open_store(db).begin() as session:
        users, total = accounts.list_users(session, Window(limit, offset))
        rows = [
            {
                "username": u.username,
                "display_name": u.display_name,
                "roles": list(u.roles),
                "team": u.team.name if u.team else None,
                "disabled": u.disabled,
            }
            for u in users
        ]
    return rows, total


@app.command("token")
def token(
    username: str = typer.Argument(..., help="Whose token."),
    name: str = typer.Option(..., "--name", help="What the token is for, e.g. 'ci'."),
    db: DbUrl = None,
) -> None:
    """Print a new API token for USERNAME (shown once; use it as `Authorization: Bearer TOKEN`).

    Example: assay user token alice --name ci
    """
    from assay.store.engine import open_store  # here, not at import: `assay user --help` stays light
    from assay.web import accounts

    with open_store(db).begin() as session:
        raw = accounts.create_api_token(session, _existing(session, username), name)
    typer.echo(raw)


def _existing(session: Any, username: str) -> Any:
    from assay.web import accounts

    found = accounts.get_user(session, username)
    if found is None:
        raise UserError(f"no web user '{username}': see `assay user list`")
    return found


@app.command("password")
def password(
    username: str = typer.Argument(..., help="Whose password."),
    password_file: Path | None = typer.Option(None, "--password-file", help="File whose first line is it."),
    db: DbUrl = None,
) -> None:
    """Set USERNAME's password from the shell, ending their sessions and lifting a lockout: the way back in
    for an organiser who forgot theirs (others can get a reset link from an organiser).

    Example: ASSAY_PASSWORD=... assay user password alice
    """
    from assay.store.engine import open_store  # here, not at import: `assay user --help` stays light
    from assay.web import accounts
    from assay.web.audit import record

    new = read_password(password_file)
    with open_store(db).begin() as session:
        found = _existing(session, username)
        accounts.set_password(session, found, new)
        accounts.end_all_sessions(session, found)
        accounts.unlock(session, found, quiet=True)
        record(session, None, "user.password_set", username)
    console().print(f"password of [bold]{username}[/] set; their sessions ended", highlight=False)


@app.command("disable")
def disable(username: Who, db: DbUrl = None) -> None:
    """Disable USERNAME: they cannot sign in, their sessions end and their API tokens are revoked at once.

    Example: assay user disable alice
    """
    _set_disabled(username, db, True)


@app.command("enable")
def enable(username: Who, db: DbUrl = None) -> None:
    """Enable USERNAME again (old API tokens stay revoked; a lockout from failed sign-ins is lifted).

    Example: assay user enable alice
    """
    _set_disabled(username, db, False)


def _set_disabled(username: str, db: str | None, disabled: bool) -> None:
    """Disable or enable an account from the shell; enabling also lifts a lockout."""
    from assay.store.engine import open_store  # here, not at import: `assay user --help` stays light
    from assay.web import accounts

    with open_store(db).begin() as session:
        found = _existing(session, username)
        accounts.set_disabled(session, None, found, disabled)
        if not disabled:
            accounts.unlock(session, found, quiet=True)
    console().print(f"{'disabled' if disabled else 'enabled'} [bold]{username}[/]", highlight=False)
