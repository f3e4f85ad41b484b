"""``llmcheck opcheck``: recompute each operator call of a dump and measure its dumped outputs.

One room per step: :mod:`.selection` (which calls the seed's filters keep),
:mod:`.case_check` (one call against its reference), :mod:`.criteria` (the precision
standard per dtype), :mod:`.measures` (the error figures), :mod:`.report` (CSV, xlsx and
terminal table) and :mod:`.command` (the command that runs them, in worker processes).
"""
