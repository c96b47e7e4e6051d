"""Fixtures the acceptance tests share: `corral`, the command as a user runs it."""

from tests.acceptance.test_cli import corral

__all__ = ["corral"]
