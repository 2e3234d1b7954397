"""Derived numbers, computed once: pure functions over stored samples
(docs/reference/metrics.md)."""
