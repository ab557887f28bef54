"""web admin: single-use password-reset links (sha256 of the token only)

Revision ID: 0005_web_admin
Revises: 0003
Create Date: 2026-11-22 19:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0005_web_admin"
down_revision = "0003"  # the web tables; a branch of its own beside 0004_dyepack and 0004_star_web
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "web_password_resets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("token_sha256", sa.String(length=64), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("used_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_by", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["created_by"], ["web_users.id"]),
        sa.ForeignKeyConstraint(["user_id"], ["web_users.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("token_sha256"),
    )
    with op.batch_alter_table("web_password_resets", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_web_password_resets_user_id"), ["user_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("web_password_resets", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_web_password_resets_user_id"))
    op.drop_table("web_password_resets")
