"""Built-in plugin 'torch_hooks' (see docs/sources/). Its hooks are added by the issue that builds it."""
