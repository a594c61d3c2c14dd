"""qag: saved SQL queries served as governed HTTP APIs."""

from . import _speedups
from .version import __version__  # noqa: F401 (qag.__version__)

# Before any compiled module is imported: QAG_SPEEDUPS and the builds decide, once, whether this process runs
# compiled or pure (qag/_speedups/__init__.py).
_speedups.select()


def create_app(*args, **kwargs):
    """The WSGI application; see qag.app.create_app (imported lazily so `import qag` stays light)."""
    from .app import create_app as _create_app
    return _create_app(*args, **kwargs)
