"""``danaus.worker``: the module path of Monarch's ``monarch.worker`` (its worker process).

danaus's workers are actors (``TensorWorker``, ``docs/tensor.md``), not Monarch's
worker process, so only the public part code written against that process uses
is here: ``worker.DeviceMesh``, a worker's view of its device mesh (where it sits
in each dimension, and the process groups of its slices).
"""
