"""The first lines of an engine of a one-machine ``MPICluster``: Hydra's control port answers
loopback alone from the moment the rank's Python starts, then ipyparallel's engine runs as usual.

``MPICluster`` starts its engines as ``python -m mpinb._engine_boot`` (ipyparallel's
``engine_cmd``) only when every rank runs on this machine: the port is unused there, and filtering
it here instead of at the engines' set-up shortens the time it answers other hosts from the
engines' start-up (seconds, more on a loaded machine) to Python's (:mod:`mpinb._listeners`).
The engine's arguments are ipyparallel's, untouched.
"""

from mpinb._listeners import confine_inherited_listeners

confine_inherited_listeners(loopback_only=True)

if __name__ == "__main__":
    from ipyparallel.engine.app import main

    main()
