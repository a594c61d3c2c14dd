"""Database backends: run one statement on a data connection and return its rows."""
