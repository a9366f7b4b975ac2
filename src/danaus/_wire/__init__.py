"""Wire layer: identifiers, message frames and the body codec.

Pure: no sockets, no threads. Imports nothing else from danaus but ``_errors``.
"""
