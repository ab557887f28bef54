"""Settings read from the environment (``ASSAY_*``), with defaults that need no set-up."""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict

from assay import dburl


class Settings(BaseSettings):
    """Where assay keeps its files. ``ASSAY_HOME`` moves them all."""

    model_config = SettingsConfigDict(env_prefix="ASSAY_")

    home: Path = Path.home() / ".assay"
    db_url: str | None = None
    db_url_file: Path | None = None  # a file holding the URL (a mounted secret), instead of db_url
    public_url: str | None = None  # the address users reach the web app at; links are built from it
    log_format: str = "text"  # the web server's logs: text, or json (one object a line; assay.web.logs)
    log_level: str = "info"
    # Requests a web worker admits at once, and its threads; its PostgreSQL pool follows (assay.web.admission)
    web_threads: int = 40

    @property
    def database_url(self) -> str:
        """``ASSAY_DB_URL`` (e.g. ``postgresql+psycopg://...``) or the contents of ``ASSAY_DB_URL_FILE``, else
        a SQLite file under ``ASSAY_HOME``."""
        return dburl.resolve(self.db_url, self.db_url_file) or f"sqlite:///{self.home / 'assay.db'}"

    @property
    def cache_path(self) -> Path:
        """The SQLite response cache shared by every model backend."""
        return self.home / "cache" / "responses.sqlite"


def settings() -> Settings:
    """Fresh settings each call, so tests can change the environment."""
    return Settings()
