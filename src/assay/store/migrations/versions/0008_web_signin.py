"""web sign-in: failed sign-ins throttled per client, per (client, name), per name and per known device,
instead of one counter on the account that anyone could trip

Revision ID: 0008_web_signin
Revises: 0007_leaderboard_integrity
Create Date: 2026-11-23 16:00:00

The account's own lockout columns go: a lock that any stranger can set is a way to keep the organiser out.
"""

import sqlalchemy as sa
from alembic import op

revision = "0008_web_signin"
down_revision = "0007_leaderboard_integrity"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "web_login_throttles",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("scope", sa.String(length=20), nullable=False),
        sa.Column("key", sa.String(length=300), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("last_failure_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("blocked_until", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("scope", "key"),
    )
    op.create_table(
        "web_devices",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("token_sha256", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["user_id"], ["web_users.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("token_sha256"),
    )
    with op.batch_alter_table("web_devices", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_web_devices_user_id"), ["user_id"], unique=False)
    with op.batch_alter_table("web_users", schema=None) as batch_op:
        batch_op.drop_column("locked_until")
        batch_op.drop_column("failed_logins")


def downgrade() -> None:
    with op.batch_alter_table("web_users", schema=None) as batch_op:
        batch_op.add_column(sa.Column("failed_logins", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("locked_until", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("web_devices", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_web_devices_user_id"))
    op.drop_table("web_devices")
    op.drop_table("web_login_throttles")
