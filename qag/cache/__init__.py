"""Caches: the shared-memory metadata cache and the response cache."""
