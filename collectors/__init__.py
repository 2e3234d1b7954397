"""Collectors: everything that gets the fleet's data in. Fetching targets (scrape.py, or
Prometheus as the source: prometheus_api.py), parsing the text exposition (parse.py),
knowing each inference engine and normalizing its metrics into canonical samples
(collectors.engines, one normalizer per engine; dcgm.py for GPUs), finding targets
(discovery.py, kubernetes.py), one collection round (collect.py), and the process around it:
the APScheduler jobs (jobs.py) on clock-safe schedulers (scheduler.py), several collectors
sharing one database (cluster.py) and the dead-man's switch (heartbeat.py). Parsing and
the engines sit low (the configuration reads the engines' names); the jobs sit on top and
set off alert evaluation, delivery and the weekly review. What does not belong: derived
numbers and status (kneepoint/derived/, kneepoint/status.py), the store's schema and
queries (kneepoint/store/), and what alerts and the review do once a job calls them
(alerts/, review/)."""
