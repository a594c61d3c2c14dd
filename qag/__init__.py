"""qag: saved SQL queries served as governed HTTP APIs."""

import os as _os

from ._speedups import request_path as _request_path

__version__ = "0.1.0"

# Before any request-path module is imported: QAG_SPEEDUPS decides whether its compiled build or its source runs.
_request_path.install(_os.environ.get("QAG_SPEEDUPS", "auto"))


def create_app(*args, **kwargs):
    """The WSGI application; see qag.app.create_app (imported lazily so `import qag` stays light)."""
    from .app import create_app as _create_app
    return _create_app(*args, **kwargs)
