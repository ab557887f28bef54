"""The round's clock: sealed results are published at fixed times, never when a job finishes

Revision ID: 0019_leaderboard_clock
Revises: 0018_web_audit_action_index
Create Date: 2026-11-29 07:00:00

``rounds.publish_every_s``: the period of the round's publication clock (assay.leaderboard.sealing): a
sealed job's result is shown at the first multiple of it since the epoch at or after the job finished.
Every round that exists publishes hourly, on the hour.
"""

import sqlalchemy as sa
from alembic import op

revision = "0019_leaderboard_clock"
down_revision = "0018_web_audit_action_index"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("rounds", schema=None) as batch_op:
        batch_op.add_column(sa.Column("publish_every_s", sa.Integer(), nullable=False, server_default="3600"))


def downgrade() -> None:
    with op.batch_alter_table("rounds", schema=None) as batch_op:
        batch_op.drop_column("publish_every_s")
