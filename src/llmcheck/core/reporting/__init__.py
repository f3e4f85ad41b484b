"""Reporting: the files and terminal lines a compare leaves, and the graph overlay."""
