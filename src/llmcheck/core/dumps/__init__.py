"""The dump format: llmcheck's own store, its schemas, tensor bytes, chunked reads, atomic files and safe paths."""
