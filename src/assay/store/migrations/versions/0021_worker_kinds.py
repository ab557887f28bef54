"""A worker records the submission kinds it can run and the splits it serves

Revision ID: 0021_worker_kinds
Revises: 0020_submission_kind
Create Date: 2026-11-29 09:30:00

``workers.kinds``: the submission kinds (``submissions.kind``: folder, archive, image, sif) this worker can
run, comma-separated; ``workers.splits``: the splits it serves (``--splits``), comma-separated, "" for all.
Rows from before are "" for both, read as "every kind, every split" (``assay.leaderboard.runnable``): a
submission is never refused on missing information (issue 49: an image sent to a round whose workers
have no podman was accepted, then queued for ever).
"""

import sqlalchemy as sa
from alembic import op

revision = "0021_worker_kinds"
down_revision = "0020_submission_kind"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.add_column(sa.Column("kinds", sa.Text(), nullable=False, server_default=""))
        batch_op.add_column(sa.Column("splits", sa.Text(), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.drop_column("splits")
        batch_op.drop_column("kinds")
