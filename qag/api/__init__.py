"""HTTP handlers: data plane (run), management API (manage), operations (ops)."""
