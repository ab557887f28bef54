"""GPU rounds: a round may require NVIDIA GPUs for each detector run

Revision ID: 0017_leaderboard_gpus
Revises: 0016_leaderboard_public
Create Date: 2026-11-28 22:00:00

``rounds.gpus``: how many GPUs each detector run of the round holds (assay.runner.gpu); a worker that does
not see that many usable NVIDIA devices takes none of its jobs (assay.leaderboard.preflight). Every round
that exists needs none.
"""

import sqlalchemy as sa
from alembic import op

revision = "0017_leaderboard_gpus"
down_revision = "0016_leaderboard_public"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("rounds", schema=None) as batch_op:
        batch_op.add_column(sa.Column("gpus", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("rounds", schema=None) as batch_op:
        batch_op.drop_column("gpus")
