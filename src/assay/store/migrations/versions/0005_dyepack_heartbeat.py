"""dyepack runs: heartbeat_at, so a run whose key holder died on another host can be failed

Revision ID: 0005_dyepack_heartbeat
Revises: 0004_dyepack
Create Date: 2026-11-24 10:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0005_dyepack_heartbeat"
down_revision = "0004_dyepack"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("dyepack_runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("dyepack_runs", schema=None) as batch_op:
        batch_op.drop_column("heartbeat_at")
