"""Sans-IO HTTP: request parsing and response building, no database and no globals."""
