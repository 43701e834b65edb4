"""A real Slurm on simulated hosts (see conftest.py and slurmsim.py): the nodes, srun's PMI, the
batch-job form of mpinb's code, and ``mpinb info --slurm``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from support.netsim import TCP, YIELD

RANKS_TESTS = Path(__file__).resolve().parent.parent / "multihost" / "ranks" / "test_across_hosts.py"


def test_nodes_are_separate_hosts(slurm):
    out = slurm.run(["sinfo", "-h", "-N", "-o", "%N %o %t"]).stdout.split("\n")
    nodes = sorted(tuple(line.split()) for line in out if line.strip())
    assert nodes == [(h.name, h.address, "idle") for h in slurm.sim.hosts]


def test_srun_with_pmi2_starts_one_world_across_nodes(slurm):
    proc = slurm.run(["srun", "-N", "2", "-n", "3", "--mpi=pmi2", sys.executable, "-m", "mpi4py.bench", "helloworld"],
                     timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = sorted(re.findall(r"I am process (\d+) of (\d+) on (\S+)\.", proc.stdout))
    assert seen == [("0", "3", "host1"), ("1", "3", "host1"), ("2", "3", "host2")]


def test_batch_form_kmeans_and_keras_match_one_process(slurm):
    """The engine-side code as a batch job runs it: `srun python ...` (here mpinb's across-hosts rank
    tests: KMeans and mpinb.keras.fit on a rank on each of 2 nodes against one process holding all data;
    two ranks, not three: TensorFlow's import on each rank is most of the time)."""
    env = {**TCP["ucx"], **YIELD, "OMP_NUM_THREADS": "1", "MPINB_TEST_TIER": "slurm-ranks",
           "MPINB_MULTIHOST_EXPECT": json.dumps(["host1", "host2"])}
    proc = slurm.run(["srun", "-N", "2", "-n", "2", "--mpi=pmi2", sys.executable, "-m", "mpi4py", "-m", "pytest",
                      str(RANKS_TESTS), "-q", "-x", "-p", "no:cacheprovider", "--timeout=120",
                      "--timeout-method=thread", "--durations=3"], env=env, timeout=150)
    print(proc.stdout[-3000:], proc.stderr[-2000:])
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]
    assert re.search(r"\b4 passed\b", proc.stdout), proc.stdout[-2000:]


def test_info_slurm_finds_one_world_with_the_pmi_it_chooses(slurm):
    proc = _mpinb_info(["--slurm", "--timeout", "30"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"ok +srun --mpi=list: offers pmix, pmi2\.", proc.stdout), proc.stdout
    assert re.search(r"ok +srun --mpi=pmi2 -n 2 python -m mpi4py.bench helloworld: two ranks of one world of 2\.",
                     proc.stdout), proc.stdout
    assert "2 of 2 pre-flight checks passed." in proc.stdout


def test_info_slurm_diagnoses_singletons_without_pmi(slurm):
    proc = _mpinb_info(["--slurm", "--mpi=none", "--timeout", "30"])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert re.search(r"FAIL +srun --mpi=none -n 2 python -m mpi4py.bench helloworld: 2 separate one-rank worlds "
                     r"\('process 0 of 1' 2 times\): srun started the processes without PMI", proc.stdout), proc.stdout
    assert "1 of 2 pre-flight checks passed; failed: srun --mpi=none -n 2" in proc.stdout


def _mpinb_info(args: list[str]) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "mpinb.client.cli", "info", *args]
    return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)
