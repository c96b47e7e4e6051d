"""PostgreSQL's hot path: the dispatcher's claim and settle, and a worker's claim, each one
data-modifying statement run on its own (autocommit) on the hot path's own async
connections (store/hotpool.py). hot.PostgresHotPath is its face (store/hotpath.HotPath);
claim.py and settle.py hold the statements.
"""
