"""``llmcheck hunt``: coarse to fine, from two programs to the culprit operator."""
