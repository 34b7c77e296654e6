"""Executing tools: one attempt under its timeout, and what kind of failure it ended in.

``attempts`` runs one attempt of a call (sync in a thread it can abandon, async as a task
it can cancel) and ``faults`` classifies what the tool raised, which the retry policy
reads. Both sit below the tool definitions in :mod:`tether.tools`, which call into them.
"""
