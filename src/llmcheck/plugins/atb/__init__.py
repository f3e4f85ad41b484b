"""Built-in plugin 'atb' (see docs/sources/). Its hooks are added by the issue that builds it."""
