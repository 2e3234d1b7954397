"""Derived numbers, computed once: pure functions over stored samples (metrics.md §3)."""
