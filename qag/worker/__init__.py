"""qag's own gunicorn worker class: `gunicorn -k qag.worker.QagWorker` (the default of `qag serve`)."""

from .worker import QagWorker

__all__ = ["QagWorker"]
