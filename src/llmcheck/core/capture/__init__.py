"""Capture: the sink that copies tensors off a run, their statistics, and the ``llmcheck dump`` command."""
