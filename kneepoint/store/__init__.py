"""The store: SQLAlchemy models, the engine and session factory, writes, queries, rollups."""
