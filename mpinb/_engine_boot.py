"""The first lines of an engine of a one-machine ``MPICluster``: Hydra's control port answers
loopback alone from the moment the rank's Python starts, then ipyparallel's engine runs as usual.

``MPICluster`` starts its engines as ``python -m mpinb._engine_boot`` (ipyparallel's
``engine_cmd``) only when every rank runs on this machine: the port is unused there, and filtering
it here instead of at the engines' set-up shortens the time it answers other hosts from the
engines' start-up (seconds, more on a loaded machine) to Python's (:mod:`mpinb._listeners`).
The engine's arguments are ipyparallel's, untouched.
"""

import sys

from mpinb import _shadow
from mpinb._listeners import confine_inherited_listeners

confine_inherited_listeners(loopback_only=True)
# A folder named mpinb in the engines' directory is what this engine's `import mpinb` found (this
# module still came from the installed package): say so in the engine's log now. The client's
# first call (mpinb._engine.identity) fails the start with the same sentence.
if _shadow.shadowing() is not None:
    print(f"mpinb: {_shadow.shadowing()}", file=sys.stderr, flush=True)

if __name__ == "__main__":
    from ipyparallel.engine.app import main

    main()
