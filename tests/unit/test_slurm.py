"""mpinb.client.slurm without a Slurm: the PMI choice, the controller address, MPICluster's launcher checks."""

from __future__ import annotations

import pytest

from mpinb.client.slurm import choose_pmi, in_allocation, parse_mpi_list, reaching_address

LISTING = "MPI plugin types are...\n\tpmix\n\tnone\n\tcray_shasta\n\tpmi2\nspecific pmix plugin versions available: pmix_v4\n"


def test_parse_mpi_list_keeps_plugin_names_only():
    assert parse_mpi_list(LISTING) == ["pmix", "none", "cray_shasta", "pmi2"]
    assert parse_mpi_list("srun: MPI types are...\nsrun: none\nsrun: pmix_v3\n") == ["none", "pmix_v3"]


@pytest.mark.parametrize(("plugins", "chosen"), [
    (["pmix", "none", "pmi2"], "pmi2"),       # MPICH's own PMI first
    (["none", "pmix_v4", "pmix_v3"], "pmix_v3"),
    (["none", "cray_shasta"], None),
])
def test_choose_pmi_prefers_pmi2_then_pmix(plugins, chosen):
    assert choose_pmi(plugins) == chosen


def test_in_allocation_reads_slurm_job_id():
    assert in_allocation({"SLURM_JOB_ID": "42"}) and not in_allocation({})


def test_reaching_address_is_loopback_only_for_this_machine():
    assert reaching_address(["127.0.0.1"]) == "127.0.0.1"
    assert reaching_address(["no-such-host.invalid"]) is None


def test_mpicluster_checks_its_launcher():
    import mpinb

    with pytest.raises(ValueError, match=r"launcher must be 'mpiexec' or 'slurm'; got 'pbs'"):
        mpinb.MPICluster(2, launcher="pbs", start=False)
    with pytest.raises(ValueError, match=r"launcher_args go with launcher='slurm'; mpiexec's arguments are mpi_args"):
        mpinb.MPICluster(2, launcher_args=["-p", "debug"], start=False)
    with pytest.raises(ValueError, match=r"mpi_args are mpiexec's; with launcher='slurm' pass srun/sbatch arguments"):
        mpinb.MPICluster(2, launcher="slurm", mpi_args=["-f", "hosts"], start=False)
