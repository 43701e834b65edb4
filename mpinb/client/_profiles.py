"""Which cluster of an IPython profile to join when the user names none: ipyparallel's cluster files.

Client. ``ipp.Cluster()`` (and ``ipcluster start --cluster-id``) give a cluster an id that names its
connection files (``security/ipcontroller-<id>-client.json``); without that id nothing connects to
it. The profile's ``security/cluster-<id>.json`` files list the clusters, with their controllers.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["newest_cluster_id"]


def newest_cluster_id(profile: str | None = None, profile_dir: str | None = None) -> str:
    """The id of the newest cluster of the profile whose controller runs.

    Client. ``""`` when the profile has no cluster files (a controller started by hand, found by
    the profile's own connection file). Raises ``LookupError`` listing the ids found when none of
    them still runs.
    """
    folder = Path(profile_dir) if profile_dir else _profile_folder(profile or "default")
    files = sorted((folder / "security").glob("cluster-*.json"), key=_mtime, reverse=True)
    found, running = [], []
    for path in files:
        try:
            data = json.loads(path.read_text())
            cluster_id = data["cluster"]["cluster_id"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        found.append(cluster_id)
        if _controller_runs(data.get("controller") or {}):
            running.append(cluster_id)
    if running or not found:
        return running[0] if running else ""
    listed = ", ".join(repr(cid) for cid in found)
    raise LookupError(
        f"no running cluster in {folder}: its cluster files name {listed}, and none of their controllers "
        "runs any more. Start one (`ipcluster start`), or pass cluster_id= for one that runs elsewhere."
    )


def _profile_folder(profile: str) -> Path:
    from IPython.paths import get_ipython_dir

    return Path(get_ipython_dir()) / f"profile_{profile}"


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _controller_runs(controller: dict) -> bool:
    """Whether the file says the controller runs; a local one must also still have its process."""
    state = controller.get("state") or {}
    if state.get("state") != "running":
        return False
    pid = state.get("pid")
    if controller.get("class") != "local" or not pid:
        return True  # started through a batch system or ssh: only its launcher could tell
    from mpinb.client._processes import alive

    return alive(int(pid))
