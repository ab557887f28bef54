"""A submission's kind is recorded: the record, not the stored files, says how its job runs

Revision ID: 0020_submission_kind
Revises: 0019_leaderboard_clock
Create Date: 2026-11-29 07:40:00

``submissions.kind``: folder, archive, image or sif, as sent (``assay.leaderboard.submissions``). Rows
from before are "", and their jobs read the kind from their stored files once those match the recorded
digest (issue 49: a missing ``image.tar`` ran as an empty folder detector).
"""

import sqlalchemy as sa
from alembic import op

revision = "0020_submission_kind"
down_revision = "0019_leaderboard_clock"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("submissions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("kind", sa.String(length=10), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("submissions", schema=None) as batch_op:
        batch_op.drop_column("kind")
