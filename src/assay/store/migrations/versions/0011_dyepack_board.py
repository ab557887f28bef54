"""dyepack board: registered models, and per run the board model it checked and the format it asked in

Revision ID: 0011_dyepack_board
Revises: 0010_star_theme_labels, 0005_dyepack_heartbeat
Create Date: 2026-11-25 10:00:00

A model row names an endpoint's API key by its environment variable only; nothing secret is stored.
"""

import sqlalchemy as sa
from alembic import op

revision = "0011_dyepack_board"
down_revision = ("0010_star_theme_labels", "0005_dyepack_heartbeat")  # the runs table lives on that branch
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "dyepack_models",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("spec", sa.String(length=500), nullable=False),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("model_name", sa.String(length=200), nullable=True),
        sa.Column("api_key_env", sa.String(length=100), nullable=True),
        sa.Column("mode", sa.String(length=20), nullable=False),
        sa.Column("fewshot", sa.Integer(), nullable=False),
        sa.Column("system_prompt", sa.Text(), nullable=True),
        sa.Column("template_name", sa.String(length=255), nullable=True),
        sa.Column("template_source", sa.Text(), nullable=True),
        sa.Column("added_by", sa.String(length=100), nullable=False),
        sa.Column("created_by", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["created_by"], ["web_users.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
    )
    with op.batch_alter_table("dyepack_runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("model_id", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("format", sa.JSON(), nullable=True))
        batch_op.create_index(batch_op.f("ix_dyepack_runs_model_id"), ["model_id"], unique=False)
        batch_op.create_foreign_key("fk_dyepack_runs_model_id", "dyepack_models", ["model_id"], ["id"])


def downgrade() -> None:
    with op.batch_alter_table("dyepack_runs", schema=None) as batch_op:
        batch_op.drop_constraint("fk_dyepack_runs_model_id", type_="foreignkey")
        batch_op.drop_index(batch_op.f("ix_dyepack_runs_model_id"))
        batch_op.drop_column("format")
        batch_op.drop_column("model_id")
    op.drop_table("dyepack_models")
