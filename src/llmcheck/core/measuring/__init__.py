"""Measuring: every pair's metrics, streamed in chunks or in blocks of small pairs, in worker processes."""
