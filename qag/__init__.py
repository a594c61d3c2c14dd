"""qag: saved SQL queries served as governed HTTP APIs."""

__version__ = "0.1.0"


def create_app(*args, **kwargs):
    """The WSGI application; see qag.app.create_app (imported lazily so `import qag` stays light)."""
    from .app import create_app as _create_app
    return _create_app(*args, **kwargs)
