"""The weekly capacity review: its numbers, this week against the last (weekly.py, from the
same views.build_view the pages use), recommendations from the tuning playbook
(recommend.py) with each one's predicted effect (effects.py, through the what-if twin), the
report as HTML and Markdown (render.py), its files (write.py), and the short summary posted
through the alerts' outbox when the report is due (deliver.py). What does not belong: when
it runs (the collector's report job, collectors/jobs.py, calls deliver.py), a replica's
numbers themselves (kneepoint/views.py, kneepoint/status.py), chat delivery (alerts/), and
the pages that show it (app/screens/weekly.py)."""
