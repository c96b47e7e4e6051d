"""Executors: one module per platform, each behind the Executor protocol in base.py."""
