"""The tensor-engine simulator (``danaus.simulator`` is its public face).

Modules: ``comm`` (the communication model), ``costs`` (fixed or measured op
costs), ``core`` (simulated workers, streams, memory, trace), ``engine``
(the tensor engine seam, composing ``storage`` (refs and their storage),
``borrows`` (Monarch's borrow messages), ``collectives`` (collectives and sends)
and ``endpoints`` (the workers' endpoints)), ``mesh`` (the simulated mesh),
``interface`` (``danaus.Simulator``). Beside them, Monarch's task-queue model of
a worker, which ``danaus.Simulator`` does not need: ``tasks`` (tasks and their
states), ``tensors`` (fake tensors, storages, memory) and ``workers`` (streams,
workers, groups; it writes its trace with ``core``'s writer). Sits above
``_tensor``; needs torch and numpy.
"""
