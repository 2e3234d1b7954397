"""Knee points: load-test runs (swept or imported), knee detection, comparison, and the
passive knee read from production data."""
