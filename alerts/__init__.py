"""Alerting: rules over kneepoint's derived numbers, their lifecycle, and (to come) delivery
to chat channels through an outbox."""
