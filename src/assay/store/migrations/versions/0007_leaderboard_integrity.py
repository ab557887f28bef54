"""leaderboard integrity: per-round storage quotas and sandbox settings, artifact sizes and release times,
and each job's first claim time

Revision ID: 0007_leaderboard_integrity
Revises: 0006_web_audit
Create Date: 2026-11-25 10:00:00

Every new column has a server default (or is nullable) so rows written before this revision stay valid:
old rounds get the default quotas, old submissions count 0 bytes until they are pruned or collected.
"""

import sqlalchemy as sa
from alembic import op

revision = "0007_leaderboard_integrity"
down_revision = "0006_web_audit"  # the newest web revision; the other branch heads are left as they are
branch_labels = None
depends_on = None


def _round_columns() -> list[sa.Column]:
    """Fresh columns each call: a Column belongs to one table once added."""
    return [
        sa.Column("quota_bytes", sa.BigInteger(), nullable=False, server_default=str(2 * 2**30)),
        sa.Column("quota_artifacts", sa.Integer(), nullable=False, server_default="50"),
        sa.Column("keep_practice", sa.Integer(), nullable=False, server_default="2"),
        sa.Column("scratch_bytes", sa.BigInteger(), nullable=False, server_default=str(2**30)),
        sa.Column("max_processes", sa.Integer(), nullable=False, server_default="256"),
        sa.Column("allow_unisolated", sa.Boolean(), nullable=False, server_default=sa.false()),
    ]


def upgrade() -> None:
    with op.batch_alter_table("rounds", schema=None) as batch_op:
        for column in _round_columns():
            batch_op.add_column(column)
    with op.batch_alter_table("submissions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("artifact_bytes", sa.BigInteger(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("artifact_removed_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("started_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("started_at")
    with op.batch_alter_table("submissions", schema=None) as batch_op:
        batch_op.drop_column("artifact_removed_at")
        batch_op.drop_column("artifact_bytes")
    with op.batch_alter_table("rounds", schema=None) as batch_op:
        for column in reversed(_round_columns()):
            batch_op.drop_column(column.name)
