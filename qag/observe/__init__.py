"""Recording without slowing a call: metrics, run history and the event log, and log lines (observer.py)."""

from .observer import Observer

__all__ = ["Observer"]
