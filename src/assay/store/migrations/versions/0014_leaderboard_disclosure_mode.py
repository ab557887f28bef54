"""how a sealed test score is shown, per round

Revision ID: 0014_leaderboard_disclosure_mode
Revises: 0013_star_claimable_index
Create Date: 2026-11-27 15:40:00

``disclosure``: ``grid`` (a fixed grid of 2^leak_bits cells on the metric's scale, chosen before any label is
read), ``bins`` (the worst-case bins of label vectors that earlier rounds used) or ``exact`` (NIST's board).
Rounds that exist keep ``bins``, the guarantee they were opened with; new rounds default to ``grid``
(assay.leaderboard.disclosure).
"""

import sqlalchemy as sa
from alembic import op

revision = "0014_leaderboard_disclosure_mode"
down_revision = "0013_star_claimable_index"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("rounds", schema=None) as batch_op:
        batch_op.add_column(sa.Column("disclosure", sa.String(10), nullable=False, server_default="bins"))


def downgrade() -> None:
    with op.batch_alter_table("rounds", schema=None) as batch_op:
        batch_op.drop_column("disclosure")
