"""People working on a campaign through a face (the web app): per-campaign settings, red-team dialogues
persisted turn by turn while they happen, expired claims released, and time worked without a break.

- Settings (``StarWebSettings``, one row per campaign, defaults until an organiser saves): the target model
  spec people chat with and its decoding, the claim timeout, the break-reminder interval.
- A red-team draft (``StarDraft``) holds the committed topic and every turn the moment it exists: a reload,
  a closed laptop or a lost connection loses nothing. ``finish_draft`` turns it into the engine's dialogue
  (``submit_dialogue``) with the pre-annotation (``check_pre_annotation``) and deletes it.
- ``release_expired`` puts claims older than the campaign's timeout back in the queue, except red-team
  chats with a turn inside the timeout (someone is still typing), and drops the released drafts.

The functions take a ``Session`` and flush, never commit (the caller owns the transaction), except
``save_reply``: it runs in a model thread after the web request is over, so it opens its own.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, Field
from sqlalchemy import delete, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from assay.errors import UserError
from assay.models import ChatModel, Conversation, GenerationParams, load_model
from assay.models.spec import SPEC_FORMS
from assay.star.agents import target_prompt
from assay.star.assign import campaign_spec, release_expired_claims, submit_dialogue
from assay.star.dialogue import check_pre_annotation
from assay.store.models import as_utc, utcnow
from assay.store.star_models import StarCampaign, StarTask
from assay.store.star_web_models import (
    DEFAULT_BREAK_MINUTES,
    DEFAULT_CLAIM_TIMEOUT_MINUTES,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_TEMPERATURE,
    StarDraft,
    StarDraftTurn,
    StarWebReport,
    StarWebSettings,
)

IDLE_RESET = timedelta(minutes=10)  # a pause this long counts as a break for the reminder
BACKENDS = ("hf", "openai", "vllm", "python")


# --- settings -------------------------------------------------------------------------------------------


class CampaignSettings(BaseModel):
    """What an organiser sets per campaign; bounded so a typo cannot lock people out for a year."""

    target_model: str = Field("", max_length=500, description="A model spec, e.g. openai:http://host/v1.")
    max_new_tokens: int = Field(DEFAULT_MAX_NEW_TOKENS, ge=1, le=8192)
    temperature: float = Field(DEFAULT_TEMPERATURE, ge=0.0, le=2.0)
    claim_timeout_minutes: int = Field(DEFAULT_CLAIM_TIMEOUT_MINUTES, ge=5, le=7 * 24 * 60)
    break_minutes: int = Field(DEFAULT_BREAK_MINUTES, ge=0, le=600, description="0 turns the reminder off.")


def settings_of(session: Session, campaign: StarCampaign) -> CampaignSettings:
    """The campaign's settings (the defaults until an organiser saves some)."""
    row = session.scalar(select(StarWebSettings).where(StarWebSettings.campaign_id == campaign.id))
    if row is None:
        return CampaignSettings()
    return CampaignSettings.model_validate(row, from_attributes=True)


def check_model_spec(spec: str) -> str:
    """A spec's form (backend prefix and something after it); loading it is left to the first message,
    because an ``hf:`` model takes a while to load and an ``openai:`` server may not be up yet."""
    spec = spec.strip()
    prefix, sep, rest = spec.partition(":")
    if spec and (prefix not in BACKENDS or not sep or not rest):
        raise UserError(f"target model {spec!r} is not a model spec; use one of {SPEC_FORMS}")
    return spec


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
    return new


def generation_params(settings: CampaignSettings) -> GenerationParams:
    return GenerationParams(max_new_tokens=settings.max_new_tokens, temperature=settings.temperature)


MAX_LOADED_MODELS = 2  # target models kept per process; the least recently used one goes first
_MODELS: OrderedDict[str, ChatModel] = OrderedDict()
_MODELS_LOCK = threading.Lock()


def target_model(spec: str) -> ChatModel:
    """The loaded model for a spec, kept while it is among the ``MAX_LOADED_MODELS`` most recently used: an
    ``hf:`` model loads once, not per message, and a campaign that moves to another model (or several
    campaigns with their own) does not keep every model it ever used in memory. Replies under way keep
    their model alive until they finish."""
    if not spec:
        raise UserError("the organiser has not chosen a target model for this campaign yet")
    with _MODELS_LOCK:
        if spec in _MODELS:
            _MODELS.move_to_end(spec)
            return _MODELS[spec]
        model = _MODELS[spec] = load_model(spec)
        while len(_MODELS) > MAX_LOADED_MODELS:
            _MODELS.popitem(last=False)
        return model


# --- red-team drafts ------------------------------------------------------------------------------------


def draft_for(session: Session, task: StarTask) -> StarDraft | None:
    """The current claimer's draft of a red-team task; one left by an earlier claimer is deleted unseen."""
    draft = session.scalar(select(StarDraft).where(StarDraft.task_id == task.id))
    if draft is not None and draft.participant_id != task.participant_id:
        session.delete(draft)
        session.flush()
        return None
    return draft


def commit_topic(session: Session, task: StarTask, topic: str, now: datetime | None = None) -> StarDraft:
    """Start the dialogue: the topic is fixed before the first message, as STAR's red teamers do."""
    if draft_for(session, task) is not None:
        raise UserError("the topic is committed already; it cannot change once the dialogue has started")
    if not topic.strip():
        raise UserError("write down your topic before the dialogue starts")
    now = now or utcnow()
    draft = StarDraft(
        task_id=task.id,
        participant_id=task.participant_id,
        topic=topic.strip(),
        target_model="",
        created_at=now,
        updated_at=now,
    )
    session.add(draft)
    session.flush()
    return draft


def awaiting_reply(draft: StarDraft) -> bool:
    """Whether the last turn is a message the model has not answered (a failed or cut-off reply)."""
    return bool(draft.turns) and draft.turns[-1].role == "user"


def add_message(session: Session, draft: StarDraft, text: str, now: datetime | None = None) -> int:
    """Store the red teamer's message before the model sees it; returns the index its reply will take."""
    if not text.strip():
        raise UserError("an empty message cannot be sent")
    if awaiting_reply(draft):
        raise UserError("the model has not answered your last message yet: ask for the reply first")
    now = now or utcnow()
    index = len(draft.turns)
    draft.turns.append(StarDraftTurn(index=index, role="user", text=text.strip(), created_at=now))
    draft.updated_at = now
    session.flush()
    return index + 1


def conversation(draft: StarDraft) -> Conversation:
    """What the target model sees: the dialogue so far, nothing about the task or the campaign."""
    return target_prompt([(turn.role, turn.text) for turn in draft.turns])


def save_reply(sessions: sessionmaker[Session], draft_id: int, index: int, text: str, model_id: str) -> bool:
    """Store the model's reply at ``index`` in its own transaction; False when the draft is gone (released
    or submitted meanwhile) or another reply to the same message got there first."""
    now = utcnow()
    try:
        with sessions.begin() as session:
            draft = session.get(StarDraft, draft_id)
            if draft is None or len(draft.turns) != index:
                return False
            turn = StarDraftTurn(draft_id=draft_id, index=index, role="assistant", text=text, created_at=now)
            session.add(turn)
            draft.updated_at, draft.target_model = now, model_id
    except IntegrityError:
        return False
    return True


def finish_draft(
    session: Session, task: StarTask, draft: StarDraft, pre_annotation: dict[str, Any], fallback_model: str
) -> int:
    """Submit the dialogue with the red teamer's pre-annotation; the dialogue id. A last message the model
    never answered is left out: annotators rate what the model said."""
    turns = list(draft.turns)
    if turns and turns[-1].role == "user":
        turns.pop()
    if not any(turn.role == "assistant" for turn in turns):
        raise UserError("send at least one message and wait for the reply before finishing")
    spec = campaign_spec(session.get_one(StarCampaign, task.campaign_id))
    answers = check_pre_annotation(spec, pre_annotation)
    dialogue_id = submit_dialogue(
        session,
        task.id,
        draft.topic,
        [(turn.role, turn.text, turn.created_at) for turn in turns],
        (draft.target_model or fallback_model)[:200],
        answers,
    )
    session.delete(draft)
    session.flush()
    return dialogue_id


# --- claims and breaks ----------------------------------------------------------------------------------


def release_expired(session: Session, campaign: StarCampaign, now: datetime | None = None) -> list[int]:
    """Release the campaign's claims older than its timeout (``release_expired_claims``) unless a red-team
    chat on them had a turn within the timeout; the released tasks' drafts go. Returns the task ids."""
    now = now or utcnow()
    timeout = timedelta(minutes=settings_of(session, campaign).claim_timeout_minutes)
    stale = session.scalars(
        select(StarTask.id).where(
            StarTask.campaign_id == campaign.id,
            StarTask.status == "claimed",
            StarTask.claimed_at < now - timeout,
        )
    ).all()
    if not stale:  # the usual case: read only, so a page view takes no write lock
        return []
    active = session.scalars(
        select(StarDraft.task_id).where(StarDraft.task_id.in_(stale), StarDraft.updated_at >= now - timeout)
    ).all()
    released = release_expired_claims(session, campaign, timeout, now, keep=active)
    if released:
        session.execute(delete(StarDraft).where(StarDraft.task_id.in_(released)))  # turns: ON DELETE CASCADE
        session.flush()
    return released


def claim_deadline(task: StarTask, settings: CampaignSettings) -> datetime | None:
    """When an untouched claim goes back to the queue (a red-team chat in use keeps it longer)."""
    if task.status != "claimed" or task.claimed_at is None:
        return None
    return as_utc(task.claimed_at) + timedelta(minutes=settings.claim_timeout_minutes)


def continuous_work(session: Session, participant_ids: list[int], now: datetime | None = None) -> timedelta:
    """How long the person has worked without a pause of ``IDLE_RESET``, from their claims, submissions
    and chat turns over the last day: the break reminder's clock, kept server-side so it survives reloads
    and works without JavaScript."""
    now = now or utcnow()
    since = now - timedelta(days=1)
    rows = session.execute(
        select(StarTask.claimed_at, StarTask.done_at).where(
            StarTask.participant_id.in_(participant_ids),
            or_(StarTask.claimed_at >= since, StarTask.done_at >= since),
        )
    ).all()
    drafts = session.scalars(
        select(StarDraft.updated_at).where(
            StarDraft.participant_id.in_(participant_ids), StarDraft.updated_at >= since
        )
    ).all()
    moments = sorted({as_utc(t) for row in rows for t in row if t is not None} | {as_utc(t) for t in drafts})
    start = previous = now
    for moment in reversed([m for m in moments if m <= now]):
        if previous - moment > IDLE_RESET:
            break
        start = previous = moment
    return now - start


# --- the campaign's latest analysis report ---------------------------------------------------------------


def latest_report(session: Session, campaign: StarCampaign) -> StarWebReport | None:
    """The report last built for this campaign on the web, or None."""
    return session.scalar(select(StarWebReport).where(StarWebReport.campaign_id == campaign.id))


def build_latest_report(
    session: Session, campaign: StarCampaign, user_id: int | None, embedder: str = "none"
) -> StarWebReport:
    """Analyse the campaign's human-made data, with the thematic map when ``embedder`` (a name for
    ``make_embedder``) is not ``none``, and keep the page as the campaign's latest report."""
    import pandas as pd

    from assay.star.analysis.report import build_report, render_html, theme_options
    from assay.star.exchange import campaign_tables

    spec = campaign_spec(campaign)
    frames = {k: pd.DataFrame(rows) for k, rows in campaign_tables(session, campaign).items()}
    result = build_report(spec, frames, themes=theme_options(embedder))
    row = latest_report(session, campaign)
    if row is None:
        row = StarWebReport(campaign_id=campaign.id)
        session.add(row)
    row.html, row.summary, row.created_by = render_html(result, spec), result.summary, user_id
    row.created_at = utcnow()
    session.flush()
    return row
