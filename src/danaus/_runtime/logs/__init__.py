"""Log forwarding: capture in every proc, the host agent's files, the client's printing."""
