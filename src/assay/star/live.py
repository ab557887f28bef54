"""A campaign run live through a face (the web app): its settings, its target model, its latest report.

- Settings (``StarWebSettings``, one row per campaign, defaults until an organiser saves): the target model
  spec people chat with and its decoding, the claim timeout, the break-reminder interval.
- ``target_model``: the loaded target models, kept per process while recently used.
- The campaign's latest analysis report, looked up by ``latest_report`` (``assay.star.reporting`` builds and
  stores it: this module imports neither the analysis nor the theme labels, which build on it).

What people do with tasks (claims, the red-team chat, ratings, expiry) is ``assay.star.workflow``; how far
the campaign has got is ``assay.star.status``. The functions take a ``Session`` and flush, never commit
(the caller owns the transaction).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from assay.durations import duration
from assay.errors import UserError, validation_error
from assay.models import ChatModel, GenerationParams, load_model
from assay.models.spec import check_spec_form, split_spec
from assay.store.models import utcnow
from assay.store.star_models import StarCampaign
from assay.store.star_web_models import (
    DEFAULT_BREAK_MINUTES,
    DEFAULT_CLAIM_TIMEOUT_MINUTES,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_TEMPERATURE,
    StarWebReport,
    StarWebSettings,
)

EMBEDDERS = {  # the thematic-map choices a face offers: make_embedder names and what they mean
    "minilm": "all-MiniLM-L6-v2, as in the STAR paper",
    "hashing": "hashing, fast and without a model",
    "none": "no thematic map",
}


# --- settings -------------------------------------------------------------------------------------------


class CampaignSettings(BaseModel):
    """What an organiser sets per campaign; bounded so a typo cannot lock people out for a year. Frozen:
    ``settings_of`` hands every step of a request the same object."""

    model_config = ConfigDict(frozen=True)

    target_model: str = Field("", max_length=500, description="A model spec, e.g. openai:http://host/v1.")
    max_new_tokens: int = Field(DEFAULT_MAX_NEW_TOKENS, ge=1, le=8192)
    temperature: float = Field(DEFAULT_TEMPERATURE, ge=0.0, le=2.0)
    claim_timeout_minutes: int = Field(DEFAULT_CLAIM_TIMEOUT_MINUTES, ge=5, le=7 * 24 * 60)
    break_minutes: int = Field(DEFAULT_BREAK_MINUTES, ge=0, le=600, description="0 turns the reminder off.")


SETTINGS_KEY = "star_settings"  # where settings_of keeps what it read, in session.info


def settings_of(session: Session, campaign: StarCampaign) -> CampaignSettings:
    """The campaign's settings (the defaults until an organiser saves some), read once per session: a STAR
    request asks for them in several steps (the claim timeout, the task's deadline), each a round trip
    before. ``save_settings`` through the same session updates what it remembers."""
    remembered = session.info.setdefault(SETTINGS_KEY, {})
    if campaign.id not in remembered:
        row = session.scalar(select(StarWebSettings).where(StarWebSettings.campaign_id == campaign.id))
        remembered[campaign.id] = (
            CampaignSettings() if row is None else CampaignSettings.model_validate(row, from_attributes=True)
        )
    return remembered[campaign.id]  # type: ignore[no-any-return]


def check_model_spec(spec: str) -> str:
    """A spec's form (backend prefix and something after it); loading it is left to the first message,
    because an ``hf:`` model takes a while to load and an ``openai:`` server may not be up yet."""
    spec = spec.strip()
    return check_spec_form(spec, "target model") if spec else spec


def save_settings(session: Session, campaign: StarCampaign, new: CampaignSettings) -> CampaignSettings:
    """Store an organiser's settings for the campaign (validated; the model spec by its form)."""
    new = new.model_copy(update={"target_model": check_model_spec(new.target_model)})
    row = session.scalar(select(StarWebSettings).where(StarWebSettings.campaign_id == campaign.id))
    if row is None:
        row = StarWebSettings(campaign_id=campaign.id)
        session.add(row)
    for name, value in new.model_dump().items():
        setattr(row, name, value)
    row.updated_at = utcnow()
    session.flush()
    session.info.setdefault(SETTINGS_KEY, {})[campaign.id] = new
    return new


def update_settings(session: Session, campaign: StarCampaign, form: dict[str, str]) -> CampaignSettings:
    """Apply an organiser's settings form: a number left blank keeps its current value, the target model is
    taken as given (blank unsets it). A bad value is a one-line ``UserError`` naming the field."""
    current = settings_of(session, campaign).model_dump()
    numbers = {name: value for name, value in form.items() if name != "target_model" and value != ""}
    try:
        new = CampaignSettings.model_validate(
            current | numbers | {"target_model": form.get("target_model", "")}
        )
    except ValidationError as err:
        raise validation_error(err, "settings") from None
    return save_settings(session, campaign, new)


def generation_params(settings: CampaignSettings) -> GenerationParams:
    """The decoding the organiser chose, as the model layer takes it."""
    return GenerationParams(max_new_tokens=settings.max_new_tokens, temperature=settings.temperature)


MAX_LOADED_MODELS = 2  # target models kept per process; the least recently used one goes first
_MODELS: OrderedDict[str, ChatModel] = OrderedDict()
_MODELS_LOCK = threading.Lock()
_LOAD_SECONDS: dict[str, float] = {}  # how long each spec took to load last, in this process
# How long a first load takes, before this process has timed one: an hf: model (a GGUF file is de-quantised
# once per machine, ~35 CPU s for SmolLM2, then loaded) took 191 s behind a busy CPU in issue 47's walk.
FIRST_LOAD = {"hf": "1 to 3 minutes", "vllm": "a few minutes"}


def target_model(spec: str) -> ChatModel:
    """The loaded model for a spec, kept while it is among the ``MAX_LOADED_MODELS`` most recently used: an
    ``hf:`` model loads once, not per message, and a campaign that moves to another model (or several
    campaigns with their own) does not keep every model it ever used in memory. Replies under way keep
    their model alive until they finish. Each load is timed, for ``loading_note``."""
    if not spec:
        raise UserError("the organiser has not chosen a target model for this campaign yet")
    with _MODELS_LOCK:
        if spec in _MODELS:
            _MODELS.move_to_end(spec)
            return _MODELS[spec]
        started = time.monotonic()
        model = _MODELS[spec] = load_model(spec)
        _LOAD_SECONDS[spec] = time.monotonic() - started
        while len(_MODELS) > MAX_LOADED_MODELS:
            _MODELS.popitem(last=False)
        return model


def warm_targets(sessions: sessionmaker[Session]) -> list[str]:
    """Load the campaigns' target models now (a server's start), so no red teamer's first reply waits for
    one: the distinct specs set, at most ``MAX_LOADED_MODELS`` (more would only push each other out).
    The specs loaded; one that fails is left to the first reply, which says why."""
    with sessions() as session:
        campaigns = session.scalars(select(StarCampaign).order_by(StarCampaign.id)).all()
        specs = list(dict.fromkeys(s for c in campaigns if (s := settings_of(session, c).target_model)))
    loaded = []
    for spec in specs[:MAX_LOADED_MODELS]:
        with contextlib.suppress(Exception):  # broad: whatever a model's code raises, the server still starts
            target_model(spec)
            loaded.append(spec)
    return loaded


def loading_note(spec: str) -> str:
    """What a red teamer waiting for a reply is told when the model must be loaded first ("" when it is
    loaded): that it is loading, and about how long that takes (the last load of this spec here, else the
    backend's usual first load), so a first reply that waits minutes does not look hung."""
    if not spec or spec in _MODELS:
        return ""
    if spec in _LOAD_SECONDS:
        took = f"about {duration(_LOAD_SECONDS[spec])}, as it took last time"
    else:
        took = FIRST_LOAD.get(split_spec(spec)[0], "a few seconds")
    return f"Loading the target model first ({took}); the replies after this one do not wait for it."


# --- the campaign's latest analysis report ---------------------------------------------------------------


def latest_report(session: Session, campaign: StarCampaign) -> StarWebReport | None:
    """The report last built for this campaign on the web, or None."""
    return session.scalar(select(StarWebReport).where(StarWebReport.campaign_id == campaign.id))
