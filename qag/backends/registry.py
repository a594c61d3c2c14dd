"""The backends of one worker by database type; drivers are imported on first use (500 driver_missing)."""

from __future__ import annotations

import importlib
import threading

from ..errors import QagError
from .base import Backend
from .sqlite import SqliteBackend

# db type → (module, class, what a user installs for it, the driver's own module)
_OPTIONAL = {
    "mysql": ("qag.backends.mysql", "MysqlBackend",
              "pip install 'qag[mysql]', after the MySQL client headers (Debian/Ubuntu: apt-get install "
              "build-essential pkg-config default-libmysqlclient-dev; other platforms: README, 'Installing')",
              "MySQLdb"),
    "postgres": ("qag.backends.postgres", "PostgresBackend", "pip install 'qag[postgres]'", "psycopg"),
}


def missing_driver(db: str) -> str | None:
    """What to install when `db`'s driver can't be imported here (one line); None when it can or needs none."""
    if db not in _OPTIONAL:
        return None
    try:
        importlib.import_module(_OPTIONAL[db][3])   # the driver alone: no backend state in a process that forks
    except ImportError as exc:
        return f"the driver for '{db}' connections is missing ({exc}): {_OPTIONAL[db][2]}"
    return None


class Backends:
    """Created in each worker after fork, so pooled connections never cross a fork."""

    def __init__(self, settings, store_files: tuple[str, ...]):
        self.settings = settings
        self._backends: dict[str, Backend] = {"sqlite": SqliteBackend(settings.home, store_files)}
        self._lock = threading.Lock()

    def get(self, db: str) -> Backend:
        backend = self._backends.get(db)
        if backend is not None:
            return backend
        if db not in _OPTIONAL:
            raise QagError("unsupported_database", f"Connections of type '{db}' are not supported")
        module_name, class_name, package, _ = _OPTIONAL[db]
        with self._lock:
            backend = self._backends.get(db)
            if backend is None:
                try:
                    module = importlib.import_module(module_name)
                except ImportError as exc:
                    raise QagError("driver_missing", f"The driver for '{db}' is not installed: {package}",
                                   detail=str(exc)) from None
                backend = getattr(module, class_name)(self.settings)
                self._backends[db] = backend
        return backend

    def close_idle(self) -> None:
        for backend in list(self._backends.values()):
            backend.close_idle()
