"""Engine-side work that the client sends: each module runs on every rank, under ipyparallel engines
or as ``mpiexec -n N python -m mpinb.jobs.<name> ...``, and is collective from start to end.

- :mod:`.demo` — the demo's k-means and Keras training (``mpinb demo``);
- :mod:`.scaling` — timings per rank count (``mpinb.client.bench.scaling``, tutorial 04);
- :mod:`.rankcheck` — a small self-check (``mpinb info``, ``mpinb demo --check``).
"""
