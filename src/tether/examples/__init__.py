"""Runnable examples of embedding tether; each may need an optional extra (see its docstring)."""
