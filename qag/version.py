"""qag's version: one place, importable by every package without loading the rest of qag."""

__version__ = "0.1.0"
