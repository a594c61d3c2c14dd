"""Reading SQL: the tokenizer, the prepared statement (which owns every reading of it) and parameter rules."""
