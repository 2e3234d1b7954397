"""Alerting: rules over the derived numbers, SLO burn rates, the outbox and chat channels.

Nothing here yet: the alerts issue fills this package. The scheduler already has a slot for
its evaluation job (collectors.schedule.Job).
"""
