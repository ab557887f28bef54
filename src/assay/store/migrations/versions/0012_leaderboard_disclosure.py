"""leaderboard disclosure budget and container image limit per round

Revision ID: 0012_leaderboard_disclosure
Revises: 0011_dyepack_board
Create Date: 2026-11-25 20:00:00

``leak_bits``: how many bits about the test labels one test submission may reveal to its team before the
round closes (assay.leaderboard.disclosure). ``image_bytes``: the largest container image a team may submit.
"""

import sqlalchemy as sa
from alembic import op

revision = "0012_leaderboard_disclosure"
down_revision = "0011_dyepack_board"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("rounds", schema=None) as batch_op:
        batch_op.add_column(sa.Column("leak_bits", sa.Float(), nullable=False, server_default="8"))
        batch_op.add_column(
            sa.Column("image_bytes", sa.BigInteger(), nullable=False, server_default=str(8 * 2**30))
        )


def downgrade() -> None:
    with op.batch_alter_table("rounds", schema=None) as batch_op:
        batch_op.drop_column("image_bytes")
        batch_op.drop_column("leak_bits")
