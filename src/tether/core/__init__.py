"""The core that decides: a run's facts, its state machine, and what happens next. No I/O.

``status`` spells the statuses, ``machine`` is the graph built from them, ``events`` is the
vocabulary of recorded facts and ``state`` folds them into a run's state; ``history`` keeps
the Messages API list valid. ``engine`` turns a state and an outcome into a step and
``flow`` strings the steps of one drive into effects a driver performs (``lifecycle`` the
rest of a run's life: create, fork, decide, cancel); ``approvals``, ``cache``, ``compat`` and
``forks`` are the decisions the flows consult.
"""
