"""Drivers: perform a flow's effects (model calls, tool attempts, store writes) and feed back.

:class:`~tether.drivers.runner.Runner` does it with plain calls, :class:`~tether.drivers.runner.AsyncRunner`
on an event loop; what to do and in which order is :mod:`tether.core.flow`'s. ``loader``
rebuilds the agent a run was started with from its stored spec, for a driver in another
process. ``stream`` follows a run's recorded events from a cursor (``Runner.stream``).
``telemetry`` is what a runner tells a tracer, ``otel`` turns it into OpenTelemetry spans
(imported only when asked for: ``tether[otel]``).
"""
