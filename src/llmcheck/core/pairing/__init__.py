"""Pairing: the plugins' proposed pairs merged by priority, and the user's mapping files."""
