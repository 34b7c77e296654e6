"""Runnable examples: the demo agent (``tether demo``) and an HTTP service embedding tether.

Each may need an optional extra (see its docstring); nothing in the library depends on them
but the CLI's ``demo`` command and the loader's ``scripted-demo`` model.
"""
