"""MPICluster.connect() to a cluster of a profile whose cluster_id the user never saw (ipp.Cluster())."""

from __future__ import annotations

import mpinb


def test_connect_finds_the_newest_running_cluster_of_a_profile(tmp_path) -> None:
    import ipyparallel as ipp
    from traitlets.config import Config

    from mpinb.client.launch import find_mpiexec

    profile_dir = str(tmp_path / "profile")
    started = ipp.Cluster(n=2, engines="mpi", profile_dir=profile_dir, controller_ip="127.0.0.1", log_level=40,
                          config=Config({"MPILauncher": {"mpi_cmd": [find_mpiexec()]}}))
    started.start_cluster_sync()
    try:
        assert started.cluster_id  # generated: in the connection files' names, never shown to the user
        started.connect_client_sync().wait_for_engines(2, timeout=60)  # connect() joins what has registered
        cluster = mpinb.MPICluster.connect(profile_dir=profile_dir, timeout=60)
        try:
            cluster.view.execute("import mpinb; r = mpinb.world().rank")
            assert cluster.pull("r") == [0, 1]
            assert cluster.cluster.cluster_id == started.cluster_id
        finally:
            cluster.stop()  # a joined cluster only disconnects
    finally:
        started.stop_cluster_sync()
