"""Alerting on the numbers the kernel computes: the rules (rules.py), the values they watch
(values.py, from the same View the pages read), one evaluation round (evaluate.py), each
alert's lifecycle (lifecycle.py: inactive, pending, firing, resolved), SLOs and their burn
rates (slo.py, slo_prepared.py), silences and maintenance windows, and delivery: every
notification a row of the outbox (outbox.py) before it is sent to a chat or incident
channel (channels/). Also here: what other tools read of kneepoint's rules, as Prometheus
recording and alerting rules (export.py) and the Grafana dashboards over them (grafana.py),
and `kneepoint alerts` (cli.py). What does not belong: computing a number
(kneepoint/derived/, kneepoint/status.py), when evaluation and delivery run
(collectors/jobs.py), and how an alert shows on a page (app/)."""
