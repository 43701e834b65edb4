"""How the cluster tests record each rank's outcome of a cell (``ATTEMPT``), wait for a cell on
every rank and read who failed (``errors_by_rank``)."""

from __future__ import annotations

from typing import Any

from ipyparallel.error import CompositeError

# Engine-side code (with ``time`` imported): ``attempt(fn)`` runs fn and leaves, as ``record``,
# what it returned or raised, and when, for the client to pull.
ATTEMPT = """
record = None

def attempt(fn):
    '''Run fn and record, as `record`, what it returned or raised, and when.'''
    global record
    began = time.time()
    try:
        value, err = fn(), None
    except BaseException as caught:  # KeyboardInterrupt included
        value, err = None, caught
    record = {"value": value, "raised": None if err is None else type(err).__name__,
              "message": "" if err is None else str(err), "began": began, "ended": time.time()}
"""


def errors_by_rank(cluster: Any, ar: Any, hang: float) -> dict[int, str]:
    """Wait up to ``hang`` seconds for the cell behind ``ar`` on every rank (else fail the test,
    naming the ranks still running it); each failing rank's ``"Name: message"``, by MPI rank."""
    ar.wait(timeout=hang)
    if not ar.ready():
        pending = [r for r, mid in enumerate(ar.msg_ids) if mid in cluster.client.outstanding]
        raise AssertionError(f"the cell still runs on ranks {pending} after {hang:g} s")
    try:
        ar.get(timeout=0)
    except CompositeError as err:
        rank_of = {eid: r for r, eid in enumerate(cluster.ids_by_rank)}
        return {rank_of[info["engine_id"]]: f"{name}: {value}" for name, value, _, info in err.elist}
    return {}


def names_the_dead_rank(deaths: str | None, rank: int, engine: int, pid: int, how: str = r"( \(SIGKILL\))?") -> bool:
    """Whether ``deaths`` (``MPICluster.deaths()``) says that ``rank`` died: by name (``how``: a
    pattern for the signal's words), or among the ranks that ended too close together for the
    host to tell which was first (a loaded host: the report then names them all, never another
    rank alone)."""
    import re

    if deaths is None:
        return False
    if re.match(rf"rank {rank} \(engine {engine}, pid {pid}\) died{how}; ", deaths):
        return True
    together = re.match(r"one of ranks [\d, -]+ \(engines (?P<engines>[\d, ]+); pids (?P<pids>[\d, ]+)\) died first: "
                        r"they ended too close together", deaths)
    return together is not None and str(engine) in together["engines"].split(", ") and (
        str(pid) in together["pids"].split(", "))
