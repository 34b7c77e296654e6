"""The core that decides: a run's state, its state machine, and what happens next. No I/O.

``machine`` is the graph (built from :mod:`tether.facts.status`) and ``state`` folds a run's
events (:mod:`tether.facts.events`) into its state. ``engine`` turns a state and an outcome
into a step; ``flow`` strings the steps of one drive into effects a driver performs: one
agent's story (``lifecycle`` the rest of a run's life: create, fork, decide, cancel).
``approvals``, ``budgets``, ``cache``, ``compat`` and ``snapshots`` are the decisions the flow
consults; ``links`` reads a run's place among runs. Beside the flow, through its extension
point (:class:`tether.core.flow.Extension`): ``children`` (agents as tools) and ``handoffs``;
``forks`` makes new runs from an earlier run's step.
"""
