"""MPICluster's arguments, checked before anything starts (no cluster needed)."""

from __future__ import annotations

import logging

import pytest

import mpinb
from mpinb.client._options import PASSED_TO_IPYPARALLEL

ipp = pytest.importorskip("ipyparallel")


def test_an_unknown_argument_is_refused_by_name_before_anything_starts() -> None:
    # Once silently handed to ipyparallel, which started 4 local engines as if nothing was said.
    with pytest.raises(TypeError, match=r"^MPICluster\(\) got an unexpected keyword argument 'launch'; .*profile_dir"):
        mpinb.MPICluster(n=4, launch="slurm")
    with pytest.raises(TypeError, match=r"unexpected keyword arguments 'engines', 'hostfile'"):
        mpinb.MPICluster(n=4, hostfile="hosts", engines="local", start=False)


def test_launcher_arguments_are_checked_together() -> None:
    with pytest.raises(ValueError, match=r"launcher must be 'mpiexec' or 'slurm'; got 'pbs'"):
        mpinb.MPICluster(n=2, launcher="pbs", start=False)
    with pytest.raises(ValueError, match=r"launcher_args go with launcher='slurm'"):
        mpinb.MPICluster(n=2, launcher_args=["--partition=debug"], start=False)
    with pytest.raises(ValueError, match=r"mpi_args are mpiexec's"):
        mpinb.MPICluster(n=2, launcher="slurm", mpi_args=["-hosts", "a"], start=False)
    options = mpinb.MPICluster(n=2, launcher="slurm", launcher_args=["--time=5"], start=False)._path.options
    assert (options.launcher, options.launcher_args, options.controller_ip) == ("slurm", ("--time=5",), None)


def test_ipyparallel_arguments_pass_through_and_own_arguments_are_checked() -> None:
    cluster = mpinb.MPICluster(n=2, start=False, cluster_id="abc", log_level="INFO", threads_per_rank=3)
    options = cluster._path.options
    assert (options.n, options.threads_per_rank, options.log_level, dict(options.cluster_kwargs)) == (
        2, 3, logging.INFO, {"cluster_id": "abc"})
    assert cluster.client is None and cluster._watchdog is None  # nothing started
    with pytest.raises(TypeError, match=r"threads_per_rank must be 'auto' or a positive integer"):
        mpinb.MPICluster(n=2, threads_per_rank="all", start=False)
    with pytest.raises(ValueError, match=r"n must be a positive integer number of engines; got 0"):
        mpinb.MPICluster(n=0, start=False)


def test_every_argument_passed_on_is_one_ipyparallel_cluster_takes() -> None:
    assert PASSED_TO_IPYPARALLEL <= set(ipp.Cluster.class_trait_names())


def test_the_repr_names_devices_in_one_word_or_by_rank():
    from mpinb.client.cluster import _devices_text

    assert _devices_text([]) == ""
    assert _devices_text(["CPU", "CPU"]) == " devices=CPU"
    assert _devices_text(["GPU 0", "GPU 1"]) == " devices=[GPU 0, GPU 1]"
    assert _devices_text(["GPU 0", "CPU"]) == " devices=[GPU 0, CPU]"
