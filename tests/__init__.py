"""qag test suite."""
