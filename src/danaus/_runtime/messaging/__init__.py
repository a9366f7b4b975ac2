"""The messaging core: a proc's I/O loop, its peers, routing to mailboxes and ports,
backpressure, the cast tree and liveness."""
