"""The folder ``llmcheck dump --backend torch`` puts first on the child's ``PYTHONPATH`` (see sitecustomize.py).

It is a package only so that installers ship ``sitecustomize.py`` with llmcheck.
"""
