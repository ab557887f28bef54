"""web audit trail: who changed which account or access, and when

Revision ID: 0006_web_audit
Revises: 0005_web_admin
Create Date: 2026-11-22 20:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0006_web_audit"
down_revision = "0005_web_admin"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "web_audit_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor_id", sa.Integer(), nullable=True),
        sa.Column("action", sa.String(length=40), nullable=False),
        sa.Column("target", sa.String(length=200), nullable=False),
        sa.Column("detail", sa.String(length=1000), nullable=False),
        sa.ForeignKeyConstraint(["actor_id"], ["web_users.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("web_audit_events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_web_audit_events_at"), ["at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("web_audit_events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_web_audit_events_at"))
    op.drop_table("web_audit_events")
