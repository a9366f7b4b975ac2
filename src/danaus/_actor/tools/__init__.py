"""Tools over running actors: code sync, introspection (stats, traces, stacks) and
simulated large meshes."""
