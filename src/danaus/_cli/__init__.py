"""The ``danaus`` command.

Imports: every lower layer.
"""
