"""mpinb.client.slurm without a Slurm: the PMI choice, the controller address, MPICluster's launcher checks."""

from __future__ import annotations

import pytest

from mpinb.client.slurm import choose_pmi, in_allocation, parse_mpi_list, reaching_address

LISTING = ("MPI plugin types are...\n\tpmix\n\tnone\n\tcray_shasta\n\tpmi2\n"
           "specific pmix plugin versions available: pmix_v4\n")


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


# -- after a fault: a lost node, srun's word on the other ranks, a job still queued ------------------

SRUN_SAYS = ("2026-12-06 04:29:38.557 [KernelNanny.0] Notifying Hub that our parent has shut down\n"
             "srun: error: host1: tasks 0-1: Segmentation fault\n"
             "srun: error: host3: task 5: Exited with exit code 3\n")


def test_srun_task_lists_and_exits_are_read_as_ranks():
    from mpinb.client._slurm_faults import TaskExit, parse_srun_exits, tasks

    assert tasks("0-2,5") == [0, 1, 2, 5] and tasks("7") == [7]
    assert parse_srun_exits(SRUN_SAYS) == [TaskExit("host1", (0, 1), "Segmentation fault"),
                                           TaskExit("host3", (5,), "Exited with exit code 3")]
    assert parse_srun_exits("srun: Job step aborted\n") == []


def test_a_lost_node_comes_first_then_what_ended_after_then_who_lives():
    from mpinb.client._slurm_faults import NodeLoss, describe_node_loss, parse_srun_exits

    hosts = ["host1", "host1", "host2", "host2", "host3", "host3"]
    found = NodeLoss(lost={"host2": "allocated"}, exits=parse_srun_exits(SRUN_SAYS), registered=[2, 3, 4, 5])
    text = describe_node_loss(found, hosts, "77")
    assert text.startswith("ranks 2-3 (host2) were lost with their node: its slurmd does not answer "
                           "(Slurm says allocated); then ranks 0-1 (host1) ended (Segmentation fault)")
    assert "then rank 5 (host3) ended (Exited with exit code 3)" in text
    assert "rank 4 is alive; Slurm job 77: cluster.restart()" in text
    # Nothing lost: the launcher's own report (deaths()'s usual path) stands.
    assert describe_node_loss(NodeLoss(lost={}, exits=[], registered=[0]), hosts, "77") is None
    # The ranks of a lost node are never said to be alive, though the controller still lists them.
    idle = describe_node_loss(NodeLoss(lost={"host2": ""}, exits=[], registered=list(range(6))), hosts, "")
    assert "(Slurm has not said yet)" in idle and "ranks 0-1, 4-5 are alive;" in idle


def test_slurmd_answers_is_a_connection_accepted_or_not():
    import socket

    from mpinb.client._slurm_faults import slurmd_answers

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert slurmd_answers("127.0.0.1", port)
    assert not slurmd_answers("127.0.0.1", port)  # closed: refused at once


def test_a_job_still_queued_is_reported_with_slurms_reason(capsys):
    from types import SimpleNamespace

    from mpinb.client._lifecycle import wait_for_new_engines

    slurm = SimpleNamespace(job="77", failure=lambda launchers: None, queued=lambda: "PENDING (Resources)")
    mc = SimpleNamespace(n=2, timeout=0.3, client=None, cluster=SimpleNamespace(engines={}),
                         _path=SimpleNamespace(slurm=slurm))
    with pytest.raises(TimeoutError, match=r"Slurm job 77 was still queued after 0 s: PENDING \(Resources\); "
                                           r"it is cancelled\."):
        wait_for_new_engines(mc, set())
    said = capsys.readouterr().err
    assert said.count("mpinb: Slurm job 77 is queued: PENDING (Resources); waiting up to 0 s") == 1


def test_an_srun_whose_output_is_not_utf8_is_reported_as_ended(tmp_path):
    # ipyparallel decodes an ended launcher's output as UTF-8 and raises on other bytes (seen in CI:
    # a dying engine's output); the engines' srun has ended all the same, and its output is quoted.
    from mpinb.client import slurm as slurm_mod

    out = tmp_path / "srun.log"
    out.write_bytes(b"engine starting\n\xcb\xff garbage\nsrun: error: host2: task 1: Exited with exit code 15\n")

    class Launcher:
        output_file = str(out)
        _output = None

        def poll(self):
            raise UnicodeDecodeError("utf-8", b"\xcb", 0, 1, "invalid continuation byte")

        def get_output(self, remove=False):
            if self._output is None:
                raise UnicodeDecodeError("utf-8", b"\xcb", 0, 1, "invalid continuation byte")
            return self._output

    engines = slurm_mod.SlurmEngines.__new__(slurm_mod.SlurmEngines)
    engines.inside, engines.pmi, engines._next_look, engines.job = True, "pmi2", 0.0, None
    why = engines.failure([Launcher()])
    assert why is not None and "ended before they registered" in why
    assert "Exited with exit code 15" in why and "\ufffd" in why


def test_engines_that_never_register_are_reported_with_the_jobs_steps_and_srun_s_words(tmp_path):
    # The CI failure this answers said only "0 of 2 registered": a step that has not ended holds the
    # CPUs of the allocation, and srun waits for them saying so.
    import subprocess

    from mpinb.client import slurm as slurm_mod

    out = tmp_path / "srun.log"
    out.write_text("srun: Job 7 step creation temporarily disabled, retrying (Requested nodes are busy)\n")

    class Launcher:
        output_file = str(out)

    engines = slurm_mod.SlurmEngines.__new__(slurm_mod.SlurmEngines)
    engines.inside, engines.pmi, engines.job = True, "pmi2", "7"
    asked = []

    def run(argv):
        asked.append(argv)
        return subprocess.CompletedProcess(argv, 0, stdout="7.0 host[1-2]\n7.1 host[1-2]\n", stderr="")

    engines._run, engines._command = run, lambda name: name
    said = engines.pending([Launcher()])
    assert asked == [["squeue", "-h", "-s", "-j", "7", "-o", "%i %N"]]
    assert "steps of job 7: 7.0 host[1-2]; 7.1 host[1-2]" in said
    assert said.endswith("srun says: srun: Job 7 step creation temporarily disabled, retrying "
                         "(Requested nodes are busy)")


def test_engines_that_never_register_under_mpiexec_are_reported_with_its_last_lines(tmp_path) -> None:
    from types import SimpleNamespace

    from mpinb.client import _lifecycle

    out = tmp_path / "mpiexec.log"
    out.write_bytes(b"2026-12-06 engine starting\n\n[IPEngine] Registration timed out after 120.0 seconds\xff\n")
    client = SimpleNamespace(ids=[], _engines={})
    mc = SimpleNamespace(n=2, timeout=0.0, client=client, _path=SimpleNamespace(slurm=None),
                         cluster=SimpleNamespace(engines={"a": SimpleNamespace(output_file=str(out)),
                                                          "b": SimpleNamespace(output_file=None)}))
    with pytest.raises(TimeoutError) as info:
        _lifecycle.wait_for_new_engines(mc, set())
    said = str(info.value)
    assert said.startswith("only 0 of 2 MPI engines registered within 0 s; mpiexec says: 2026-12-06 engine starting | "
                           "[IPEngine] Registration timed out after 120.0 seconds\ufffd;"), said


def test_engines_whose_mpiexec_ended_are_reported_at_once_with_its_output() -> None:
    from types import SimpleNamespace

    from mpinb.client import _lifecycle

    launcher = SimpleNamespace(poll=lambda: 1, get_output=lambda remove=False: (
        "[IPEngine] Registration timed out after 5.0 seconds\n[IPEngine] engine exiting\n"))
    # An hour's timeout: only the ended mpiexec can end this wait (else the test's own timeout fails it).
    mc = SimpleNamespace(n=2, timeout=3600.0, client=SimpleNamespace(ids=[], _engines={}),
                         _path=SimpleNamespace(slurm=None), cluster=SimpleNamespace(engines={"a": launcher}))
    with pytest.raises(RuntimeError, match=r"the engines' mpiexec ended before 2 of 2 engines registered: "
                                           r"\[IPEngine\] Registration timed out after 5.0 seconds \| "):
        _lifecycle.wait_for_new_engines(mc, set())
