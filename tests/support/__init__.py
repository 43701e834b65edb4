"""What the test tiers share: MPI assertions (``mpitools``), a communicator that counts its calls
(``counting``), k-means cases (``kmeans_cases``), a one-process Keras reference (``keras_reference``),
simulated hosts (``netsim``), a real Slurm on them (``slurmsim``) and waiting for a cluster's cell (``cells``).

Imported as ``from support import mpitools``: pytest puts ``tests/`` on the path (``pythonpath`` in
pyproject.toml), and ``tests/run.py`` runs from there.
"""
