"""Runnable examples: the demo agent (``tether demo``), an HTTP service embedding tether, and a writer/reviewer pair.

Each may need an optional extra (see its docstring); nothing in the library depends on them
but the CLI's ``demo`` command and the loader's ``scripted-demo`` model.
"""
