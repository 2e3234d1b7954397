"""kneepoint: capacity and SLO monitoring for self-hosted LLM inference fleets."""

__version__ = "0.1.0"
