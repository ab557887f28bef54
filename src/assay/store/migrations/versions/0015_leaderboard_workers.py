"""leaderboard workers: a heartbeat row per worker, and platform faults retried with back-off per job

Revision ID: 0015_leaderboard_workers
Revises: 0014_leaderboard_disclosure_mode
Create Date: 2026-11-27 18:00:00

``workers``: one row per running worker (host, pid, version, isolation, health and why not, its current
job), stamped every few seconds; a stale stamp means the worker is dead (assay.leaderboard.fleet).
``jobs.platform_faults`` and ``jobs.not_before``: a job the platform failed (isolation, disk, database, a
lost node) is requeued and not claimed before ``not_before``; after a few it ends as ``platform-error``.
"""

import sqlalchemy as sa
from alembic import op

revision = "0015_leaderboard_workers"
down_revision = "0014_leaderboard_disclosure_mode"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "workers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("host", sa.String(length=200), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("version", sa.String(length=40), nullable=False),
        sa.Column("isolation", sa.String(length=20), nullable=False),
        sa.Column("executor", sa.String(length=20), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("healthy", sa.Boolean(), nullable=False),
        sa.Column("problem", sa.Text(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("platform_faults", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("not_before", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("not_before")
        batch_op.drop_column("platform_faults")
    op.drop_table("workers")
