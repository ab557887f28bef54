"""A red teamer's live conversation with the target model, and their pre-annotation, for human red teaming.

The web page (and any other face) holds a ``DialogueSession`` per claimed red-team task: the topic is
committed first, each message goes to the target model through ``assay.models`` (any backend), every turn is
timestamped when sent and when the reply arrives, and ``finish`` stores it all with the red teamer's
pre-annotation: was the assigned rule broken, were other rules broken, which groups were mentioned (the
larger STAR label set: race or ethnicity, gender, disability, age, religion, sexual orientation, plus the
campaign's own attributes).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from assay.errors import UserError, field_error
from assay.models.base import ChatModel, GenerationParams
from assay.star.agents import MENTION_LABELS, target_prompt
from assay.star.assign import submit_dialogue
from assay.star.spec import CampaignSpec
from assay.store.models import utcnow


def mention_labels(spec: CampaignSpec) -> list[str]:
    """Every label a red teamer may tick under 'groups mentioned'."""
    return sorted(set(MENTION_LABELS) | set(spec.demographics.attributes))


def check_pre_annotation(spec: CampaignSpec, answers: dict[str, Any]) -> dict[str, Any]:
    """Validate a pre-annotation: ``assigned_rule_broken`` (bool or None for unsure), ``other_rules_broken``
    (rule ids), ``groups_mentioned`` (labels from ``mention_labels``)."""
    known = {"assigned_rule_broken", "other_rules_broken", "groups_mentioned"}
    extra = sorted(set(answers) - known)
    if extra:
        raise UserError(f"pre-annotation: unknown field {extra[0]!r} (fields: {', '.join(sorted(known))})")
    broken = answers.get("assigned_rule_broken")
    if broken is not None and not isinstance(broken, bool):
        raise field_error("pre-annotation", "assigned_rule_broken", broken, "must be true, false or null")
    rules = list(answers.get("other_rules_broken") or [])
    for rule_id in rules:
        spec.rule(rule_id)  # one line naming the known rules when unknown
    labels = list(answers.get("groups_mentioned") or [])
    allowed = mention_labels(spec)
    unknown = [label for label in labels if label not in allowed]
    if unknown:
        raise UserError(
            f"pre-annotation: field 'groups_mentioned' has unknown label {unknown[0]!r} "
            f"(labels: {', '.join(allowed)})"
        )
    return {"assigned_rule_broken": broken, "other_rules_broken": rules, "groups_mentioned": labels}


class DialogueSession:
    """One red-team dialogue in progress: the committed topic and timestamped turns."""

    def __init__(self, model: ChatModel, topic: str, params: GenerationParams | None = None) -> None:
        if not topic.strip():
            raise UserError("commit to a topic before the dialogue starts")
        self.model = model
        self.topic = topic.strip()
        self.params = params or GenerationParams(max_new_tokens=256)
        self.turns: list[tuple[str, str, datetime]] = []

    def send(self, text: str) -> str:
        """Send the red teamer's message; the target's reply is stored and returned."""
        if not text.strip():
            raise UserError("an empty message cannot be sent")
        self.turns.append(("user", text, utcnow()))
        reply = self.model.chat([target_prompt([(r, t) for r, t, _ in self.turns])], self.params)[0]
        self.turns.append(("assistant", reply, utcnow()))
        return reply

    def finish(
        self, session: Session, spec: CampaignSpec, task_id: int, pre_annotation: dict[str, Any]
    ) -> int:
        """Store the dialogue for the claimed red-team task and open its annotation tasks; the dialogue id."""
        if not self.turns:
            raise UserError("the dialogue has no turns yet")
        answers = check_pre_annotation(spec, pre_annotation)
        return submit_dialogue(session, task_id, self.topic, self.turns, self.model.model_id, answers)
