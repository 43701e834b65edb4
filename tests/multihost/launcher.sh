#!/bin/sh
# Stand-in for ssh, for MPICH's Hydra (`mpiexec -launcher ssh -launcher-exec THIS`) and for
# `mpinb info --hosts ... --launcher-exec THIS`: runs a command on a simulated host of the
# multihost tier, i.e. inside that host's network and UTS namespaces.
#
# Called as ssh is:  launcher.sh [ssh options] HOST COMMAND...
# HOST is a name or an address in $MPINB_SIMHOSTS ("name:address:holder-pid,..." as written by
# tests/multihost/netsim.py). Like ssh, the command words are joined and run by a shell there
# (Hydra quotes the proxy's path for that remote shell); an unknown host fails as ssh does, with
# exit status 255.
while [ $# -gt 0 ]; do
    case "$1" in
        -o|-p|-l|-i|-F) shift 2 ;;   # ssh options that take a value
        -*) shift ;;                 # -x, -q, -T, -n ...
        *) break ;;
    esac
done
host=$1
if [ -z "$host" ] || [ $# -lt 2 ]; then
    echo "usage: $0 [ssh options] HOST COMMAND..." >&2
    exit 255
fi
shift
if [ -z "$MPINB_SIMHOSTS" ]; then
    echo "ssh: connect to host $host: MPINB_SIMHOSTS (the simulated hosts) is not set" >&2
    exit 255
fi
pid=$(printf '%s\n' "$MPINB_SIMHOSTS" | tr ',' '\n' | awk -F: -v h="$host" '$1 == h || $2 == h { print $3; exit }')
if [ -z "$pid" ] || [ ! -e "/proc/$pid/ns/net" ]; then
    echo "ssh: connect to host $host port 22: No route to host" >&2
    exit 255
fi
exec nsenter --target "$pid" --net --uts -- sh -c "$*"
