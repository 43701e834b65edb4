"""The framework-neutral core of sharded training, over NumPy arrays and mpinb's collective layer.

Nothing here imports a deep-learning framework: :mod:`mpinb.keras` (and any later glue) turns its
variables and callbacks into calls of these modules.

- :mod:`.plan` — steps per epoch agreed by every rank, each epoch's batches, executions;
- :mod:`.packing` — arrays packed into one buffer per dtype for a collective;
- :mod:`.exchange` — the per-step gradient exchange, carrying the stop votes;
- :mod:`.averaging` — means and sums of model state, metric states and logs over ranks;
- :mod:`.stopping` — the joint stop decision;
- :mod:`.checkpoint` — the checkpoint file and its epoch record.
"""
