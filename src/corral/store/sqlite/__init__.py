"""SQLite's hot path: the dispatcher's claim and settle as a few prepared statements each,
executemany over plain tuples, inside the store's one writer's transaction (each begins
IMMEDIATE, so reads inside it are exact and cost no round trip). hot.SqliteHotPath is its
face (store/hotpath.HotPath); claim.py and settle.py hold the statements.
"""
