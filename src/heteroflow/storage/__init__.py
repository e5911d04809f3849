"""Persistence on SQLAlchemy 2: SQLite by default, PostgreSQL in production; Alembic migrations.

Implements the store interfaces that the domain packages declare. Blocking calls, made from worker
threads by the async shell; every transaction is short and makes no network call but the database's.
"""
