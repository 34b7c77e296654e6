"""Where people meet tether: the ``tether`` command line and the terminal experience.

The only layer that imports rich; nothing below it knows a terminal exists.
"""
