"""Judging and attribution: verdicts, noise, feeders, repeats, suspects -- from measured pairs to the culprit."""
