"""Read-only views of runs for people and services: the audit log, pending approvals, diagrams.

Each reads stored facts (rows or the event vocabulary) and decides nothing; decisions go
through :mod:`tether.core.approvals`.
"""
