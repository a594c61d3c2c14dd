"""SQL analysis: the tokenizer, statement preparation and parameter rules."""
