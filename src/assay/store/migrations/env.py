"""Alembic environment: migrations run on the connection ``assay.store.engine.upgrade`` passes in."""

from alembic import context

# Imported for their side effect: registering the star_, web_ and dyepack_ tables on Base.metadata.
import assay.store.dyepack_models
import assay.store.star_models
import assay.store.star_web_models
import assay.store.web_models  # noqa: F401  (all bind the name `assay`)
from assay.store.models import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
