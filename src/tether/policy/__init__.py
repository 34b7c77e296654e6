"""The policy the core applies: retry and approval settings, rules, limits, budgets, prices.

Frozen data and pure decisions (``policies``, ``rules``), and the reading of a run's spend
against its limits (``budgets``, ``pricing``). Nothing here performs I/O.
"""
