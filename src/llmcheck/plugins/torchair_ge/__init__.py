"""Built-in plugin 'torchair_ge' (see docs/sources/). Its hooks are added by the issue that builds it."""
