"""An index on the audit trail's action

Revision ID: 0018_web_audit_action_index
Revises: 0017_leaderboard_gpus
Create Date: 2026-11-27 22:15:00

A STAR claim asks the audit trail which tasks the claimant gave back (``star.workflow.given_back``: skip
memory per person). Without an index on ``action`` every claim read the whole trail, which grows with every
sign-in and change; with it a claim reads the ``star.give_back`` events only.
"""

from alembic import op

revision = "0018_web_audit_action_index"
down_revision = "0017_leaderboard_gpus"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("web_audit_events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_web_audit_events_action"), ["action"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("web_audit_events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_web_audit_events_action"))
