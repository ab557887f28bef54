"""public standings: an organiser may open a round's standings to visitors who are not signed in

Revision ID: 0016_leaderboard_public
Revises: 0015_leaderboard_workers
Create Date: 2026-11-28 10:00:00

``rounds.public``: anyone may read the round's standings and closed results without signing in, as a member
of no team does (assay.leaderboard.views). Every round that exists stays private.
"""

import sqlalchemy as sa
from alembic import op

revision = "0016_leaderboard_public"
down_revision = "0015_leaderboard_workers"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("rounds", schema=None) as batch_op:
        batch_op.add_column(sa.Column("public", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("rounds", schema=None) as batch_op:
        batch_op.drop_column("public")
