"""Alembic environment for Kiln's schema; run through controller.store.engine.migrate."""

from alembic import context
from sqlmodel import SQLModel

import controller.store.models  # noqa: F401  (registers the tables)

config = context.config
connection = config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run Kiln's migrations through controller.store.engine.migrate")
context.configure(
    connection=connection,
    target_metadata=SQLModel.metadata,
    render_as_batch=True,
)
with context.begin_transaction():
    context.run_migrations()
