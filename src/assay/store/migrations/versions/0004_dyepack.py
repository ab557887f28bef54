"""dyepack tables: registered benchmarks (by commitment) and verification runs

Revision ID: 0004_dyepack
Revises: 0003
Create Date: 2026-11-23 10:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0004_dyepack"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "dyepack_benchmarks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("url", sa.String(length=500), nullable=False),
        sa.Column("commitment", sa.String(length=64), nullable=False),
        sa.Column("release_fingerprint", sa.String(length=100), nullable=True),
        sa.Column("commitment_text", sa.Text(), nullable=False),
        sa.Column("created_by", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["created_by"], ["web_users.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
    )
    op.create_table(
        "dyepack_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("benchmark_id", sa.Integer(), nullable=False),
        sa.Column("model_spec", sa.String(length=500), nullable=False),
        sa.Column("model_name", sa.String(length=200), nullable=True),
        sa.Column("release_name", sa.String(length=255), nullable=False),
        sa.Column("alpha", sa.Float(), nullable=False),
        sa.Column("max_new_tokens", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("worker", sa.String(length=200), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("total_queries", sa.Integer(), nullable=False),
        sa.Column("done_queries", sa.Integer(), nullable=False),
        sa.Column("created_by", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("flagged", sa.Boolean(), nullable=True),
        sa.Column("verdict", sa.Text(), nullable=True),
        sa.Column("activated", sa.Integer(), nullable=True),
        sa.Column("backdoors", sa.Integer(), nullable=True),
        sa.Column("k_values", sa.JSON(), nullable=True),
        sa.Column("fpr", sa.Float(), nullable=True),
        sa.Column("log10_fpr", sa.Float(), nullable=True),
        sa.Column("chernoff_bound", sa.Float(), nullable=True),
        sa.Column("samples", sa.Integer(), nullable=True),
        sa.Column("samples_on_target", sa.Integer(), nullable=True),
        sa.Column("unparsed", sa.Integer(), nullable=True),
        sa.Column("per_backdoor", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(["benchmark_id"], ["dyepack_benchmarks.id"]),
        sa.ForeignKeyConstraint(["created_by"], ["web_users.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("dyepack_runs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_dyepack_runs_benchmark_id"), ["benchmark_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("dyepack_runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_dyepack_runs_benchmark_id"))
    op.drop_table("dyepack_runs")
    op.drop_table("dyepack_benchmarks")
