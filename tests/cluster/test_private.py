"""A one-machine cluster is its owner's alone: another account reaches none of its endpoints, its
files are owner-only and go with it, and killing its controller's main process leaves nothing."""

from __future__ import annotations

import glob
import json
import os
import subprocess
from pathlib import Path

import psutil
import pytest

import mpinb

# Run as `nobody`: connect to every endpoint, send a frame to each, subscribe to each, and count
# what arrives. The venv's interpreter may be out of nobody's reach: a system python3 with the
# venv's site-packages (pyzmq) on its path.
STRANGER = r"""
import json, sys, zmq
ctx = zmq.Context()
socks, got = [], 0
for url in json.load(sys.stdin):
    for kind in (zmq.DEALER, zmq.SUB):
        s = ctx.socket(kind)
        s.linger = 0
        if kind == zmq.SUB:
            s.setsockopt(zmq.SUBSCRIBE, b"")
        s.connect(url)
        socks.append((kind, s))
for kind, s in socks:
    if kind == zmq.DEALER:
        try:
            s.send(b"AAAAAAAAAA", zmq.NOBLOCK)
        except zmq.Again:
            pass
poller = zmq.Poller()
for _, s in socks:
    poller.register(s, zmq.POLLIN)
for _ in range(4):  # two seconds of whatever the cluster sends meanwhile
    for s, _ in poller.poll(500):
        while True:
            try:
                s.recv(zmq.NOBLOCK); got += 1
            except zmq.Again:
                break
print(json.dumps({"sockets": len(socks), "received": got}))
"""


@pytest.fixture(scope="module")
def cluster2():
    cluster = mpinb.MPICluster(n=2)
    try:
        yield cluster
    finally:
        cluster.stop()


def _listening_urls(cluster) -> list[str]:
    """Every ZMQ endpoint of the cluster: the controller's (from its connection files) and every TCP
    port a process of the cluster listens on (the engines' nannies and heartbeat monitors),
    Hydra's control port excepted (it speaks PMI, not ZMQ)."""
    urls = set()
    security = Path(str(cluster.cluster.profile_dir)) / "security"
    for path in security.glob(f"ipcontroller-{cluster.cluster.cluster_id}-*.json"):
        info = json.loads(path.read_text())
        for key, value in info.items():
            ports = value if isinstance(value, list) else [value]
            urls.update(f"{info['interface']}:{p}" for p in ports if isinstance(p, int) and key != "location")
    hydra = set()
    for pid in cluster._tracked_pids():
        try:
            proc = psutil.Process(pid)
            conns = [c for c in proc.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN]
        except psutil.Error:
            continue
        ports = {c.laddr.port for c in conns}
        if "hydra" in proc.name() or "mpiexec" in proc.name():
            hydra |= ports
        urls.update(f"tcp://127.0.0.1:{p}" for p in ports)
    return sorted(u for u in urls if int(u.rsplit(":", 1)[1]) not in hydra)


def test_another_account_reaches_no_endpoint_and_the_owner_loses_nothing(cluster2, tmp_path) -> None:
    if os.geteuid() != 0: pytest.skip("needs root, to run the stranger as `nobody`")  # noqa: E701
    urls = _listening_urls(cluster2)
    assert len(urls) >= 10, urls
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(Path(psutil.__file__).parents[1])}
    # Output the whole time the stranger listens.
    printing = cluster2.view.execute("import mpinb, time\nfor _ in range(40): print('the owner secret', flush=True); "
                                     "time.sleep(0.1)", block=False)
    probe = subprocess.run(["runuser", "-u", "nobody", "--", "python3", "-c", STRANGER], input=json.dumps(urls),
                           capture_output=True, text=True, env=env, cwd="/", timeout=60)
    assert probe.returncode == 0, probe.stderr[-2000:]
    result = json.loads(probe.stdout)
    assert result == {"sockets": 2 * len(urls), "received": 0}, result
    printing.get(timeout=60)
    # Nothing the stranger sent reached a queue: every engine answers the next request at once.
    replies = [cluster2.client[eid].apply_async(os.getpid) for eid in cluster2.ids_by_rank]
    assert [r.get(timeout=30) for r in replies] == cluster2._engine_pids
    cluster2.view.execute("ok = mpinb.world().size")
    assert cluster2.pull("ok") == [2, 2]


def test_every_file_of_the_cluster_is_owner_only(cluster2) -> None:
    leftovers = cluster2._path.leftovers
    files = sorted({p for pattern in leftovers for p in glob.glob(pattern)})
    names = " ".join(os.path.basename(p) for p in files)
    for part in ("ipcontroller-", "ipengine-", "engines", "cluster-", "-client.json", "mpinb-engines-"):
        assert part in names, names
    modes = {}
    for path in files:
        for root, dirs, inside in os.walk(path) if os.path.isdir(path) else [("", [], [path])]:
            for p in [root, *(os.path.join(root, d) for d in dirs), *(os.path.join(root, f) for f in inside)]:
                if p:
                    modes[p] = os.stat(p).st_mode & 0o777
    assert {p: m for p, m in modes.items() if m & 0o077} == {}
    profile = str(cluster2.cluster.profile_dir)
    assert {os.stat(os.path.join(profile, d)).st_mode & 0o777 for d in ("log", "security")} == {0o700}


def test_a_killed_controller_leaves_no_process_and_stop_no_file(cluster2) -> None:
    controller = psutil.Process(cluster2.cluster.controller.pid)
    children = controller.children(recursive=True)
    assert len(children) >= 4, children
    everything = [psutil.Process(p) for p in cluster2._tracked_pids()]
    leftovers = set(cluster2._path.leftovers)
    assert any(p.startswith("/dev/shm/") for p in leftovers), leftovers
    controller.kill()
    controller.wait(10)
    assert any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children)  # orphaned, not ended
    cluster2.stop()
    alive = [p.pid for p in everything if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == []
    assert [p for pattern in leftovers for p in glob.glob(pattern)] == []
