"""Job layer: how hosts are obtained (this machine, local worker processes, ...).

Imports: every layer below it.
"""
