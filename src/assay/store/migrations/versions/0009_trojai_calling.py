"""TrojAI calling convention per round: whether detectors get the `infer` word, and a source data folder

Revision ID: 0009_trojai_calling
Revises: 0008_web_signin
Create Date: 2026-11-23 18:00:00

NIST's harness calls a detector without the `infer` word and passes `--source_dataset_dirpath` where a round
has one; old rounds keep the word they were run with (server default true), new ones default to NIST's.
"""

import sqlalchemy as sa
from alembic import op

revision = "0009_trojai_calling"
down_revision = "0008_web_signin"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("rounds", schema=None) as batch_op:
        batch_op.add_column(sa.Column("infer_word", sa.Boolean(), nullable=False, server_default=sa.true()))
        batch_op.add_column(sa.Column("source_dataset", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("rounds", schema=None) as batch_op:
        batch_op.drop_column("source_dataset")
        batch_op.drop_column("infer_word")
