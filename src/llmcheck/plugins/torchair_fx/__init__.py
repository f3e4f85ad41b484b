"""Built-in plugin 'torchair_fx' (see docs/sources/). Its hooks are added by the issue that builds it."""
