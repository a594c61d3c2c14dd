"""Policy: who may run what (grants) and what a statement may do (guard)."""
