"""Collectors: scrape targets, parse and normalize their metrics, hand canonical samples on."""
