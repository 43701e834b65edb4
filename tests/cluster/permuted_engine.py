"""An engine that registers with id ``size - 1 - rank`` instead of its MPI rank.

ipyparallel engines started with ``--mpi`` ask for their rank as id, so ids and ranks usually agree;
they do not for a second engine set or under launchers that start engines without ``--mpi``. Tests
use this engine to prove that mpinb orders results by MPI rank, not by engine id.
"""

import os
import sys

rank, size = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
args = [a for a in sys.argv[1:] if a != "--mpi"]
os.execv(sys.executable, [sys.executable, "-m", "ipyparallel.engine", *args, f"--IPEngine.id={100 + size - 1 - rank}"])
