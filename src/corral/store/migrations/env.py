"""Alembic environment: runs on the connection corral hands over (see store/migrate.py)."""

from alembic import context

from corral.store.indexes import compared_on, metadata  # the tables and their indexes

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
    include_object=compared_on(connection.dialect.name),
    # Handed a connection outside a transaction: one transaction per migration, so that one
    # may step outside it (PostgreSQL's CREATE INDEX CONCURRENTLY).
    transaction_per_migration=not connection.in_transaction(),
)
with context.begin_transaction():
    context.run_migrations()
