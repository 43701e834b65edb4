"""Which cluster of a profile MPICluster.connect() joins without a cluster_id (no cluster started)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mpinb.client._profiles import newest_cluster_id


def cluster_file(profile, cluster_id, pid, state="running", mtime=None):
    security = profile / "security"
    security.mkdir(parents=True, exist_ok=True)
    path = security / f"cluster-{cluster_id}.json"
    controller = {"class": "local", "state": {"pid": pid, "state": state}}
    path.write_text(json.dumps({"cluster": {"cluster_id": cluster_id}, "controller": controller}))
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_the_newest_running_cluster_wins(tmp_path):
    cluster_file(tmp_path, "1700000000-aaaa", os.getpid(), mtime=1_700_000_000)
    cluster_file(tmp_path, "1700000500-bbbb", os.getpid(), mtime=1_700_000_500)
    cluster_file(tmp_path, "1700000900-cccc", dead_pid(), mtime=1_700_000_900)  # newest, but its controller died
    assert newest_cluster_id(profile_dir=str(tmp_path)) == "1700000500-bbbb"


def test_no_cluster_files_means_the_profiles_own_connection_file(tmp_path):
    assert newest_cluster_id(profile_dir=str(tmp_path)) == ""


def test_only_stopped_clusters_are_named(tmp_path):
    cluster_file(tmp_path, "1700000000-aaaa", dead_pid())
    cluster_file(tmp_path, "1700000500-bbbb", os.getpid(), state="stopped")
    with pytest.raises(LookupError, match=rf"no running cluster in {tmp_path}: its cluster files name "
                                          r"'1700000\d00-\w+', '1700000\d00-\w+', and none of their controllers runs"):
        newest_cluster_id(profile_dir=str(tmp_path))
