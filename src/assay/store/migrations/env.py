"""Alembic environment: migrations run on the connection ``assay.store.engine.upgrade`` passes in."""

from alembic import context

import assay.store.star_models  # noqa: F401  (registers the star_ tables on Base.metadata)
from assay.store.models import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
