"""Built-in plugin 'metrics' (see docs/sources/). Its hooks are added by the issue that builds it."""
