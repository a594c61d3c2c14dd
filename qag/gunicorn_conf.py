"""gunicorn settings from qag's settings: `gunicorn -c python:qag.gunicorn_conf 'qag.app:create_app()'`."""

from qag.settings import load as _load

_settings = _load()

bind = [_settings.bind]
workers = _settings.workers
threads = _settings.threads
worker_class = "gthread"
timeout = _settings.timeout
graceful_timeout = _settings.graceful_timeout
keepalive = 5
# Each worker builds its own gateway after fork: store and data connections are never shared across it.
preload_app = False
accesslog = "-" if _settings.access_log else None
# The path without the query string: parameter values can be personal data.
access_log_format = '%(h)s - %(t)s "%(m)s %(U)s %(H)s" %(s)s %(b)s %(L)ss rid=%({x-request-id}o)s "%(a)s"'
errorlog = "-"
loglevel = _settings.log_level
proc_name = "qag"
