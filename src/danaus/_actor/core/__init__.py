"""Per-proc actor machinery: the actor cell, the current context, futures, ports and
reply collectors, failures, handoffs, ownership and the proc's spawn service."""
