"""The metadata store: connections, saved queries and versions, API keys, roles, audit log."""
