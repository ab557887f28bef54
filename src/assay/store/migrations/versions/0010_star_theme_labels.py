"""STAR theme labels: the clusters reviewers label (keyed by their dialogues) and the two reviews of each

Revision ID: 0010_star_theme_labels
Revises: 0009_trojai_calling
Create Date: 2026-11-24 09:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0010_star_theme_labels"
down_revision = "0009_trojai_calling"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "star_web_theme_clusters",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("campaign_id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("members", sa.JSON(), nullable=False),
        sa.Column("terms", sa.JSON(), nullable=False),
        sa.Column("label", sa.String(length=200), nullable=True),
        sa.Column("decision", sa.String(length=20), nullable=True),
        sa.Column("decided_by", sa.Integer(), nullable=True),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["campaign_id"], ["star_campaigns.id"]),
        sa.ForeignKeyConstraint(["decided_by"], ["web_users.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("campaign_id", "key"),
    )
    op.create_table(
        "star_web_theme_reviews",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cluster_id", sa.Integer(), nullable=False),
        sa.Column("slot", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("label", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["cluster_id"], ["star_web_theme_clusters.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["user_id"], ["web_users.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("cluster_id", "slot"),
        sa.UniqueConstraint("cluster_id", "user_id"),
    )


def downgrade() -> None:
    op.drop_table("star_web_theme_reviews")
    op.drop_table("star_web_theme_clusters")
