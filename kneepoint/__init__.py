"""kneepoint: capacity and SLO monitoring for self-hosted LLM inference fleets.

This package is the kernel the other folders build on: the configuration (config.py,
durations.py, secrets.py, auth.py), the store (store/, migrations/), the canonical samples
(samples.py), the derived numbers (derived/, counters.py, knee/, forecast.py), the status and
what each page shows (status.py, views.py, fleet_status.py, series.py, distribution.py),
what changed and why (timeline.py, causes.py, runbooks.py), the collector's own health
(health.py), the fleet twin and what-if (twin/, whatif/), and, on top, the command line
(cli.py) and the app's process (appserver.py, webapp.py). What belongs here is what reads
the store and computes. What does not: scraping (collectors/), alert rules and delivery
(alerts/), the weekly review (review/), Plotly figures (dashboards/) and page layout
(app/)."""

__version__ = "0.1.0"
