"""The words every layer speaks: run statuses, the Messages API history, token usage and recorded events.

Nothing here decides or performs anything, and nothing here imports any other part of tether
but :mod:`tether.errors`: model adapters build histories and usage, stores encode events and
statuses, the core folds events into a run's state, and views read them back, all in these
same types.
"""
