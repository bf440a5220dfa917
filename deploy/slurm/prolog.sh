#!/bin/sh
# Slurm Prolog (slurm.conf: Prolog=/usr/share/commtap/slurm/prolog.sh). The node daemon
# counts every MPI process from its first call, so the prolog only makes sure one runs;
# the job is found by its Slurm cgroup (or SLURM_JOB_ID) at epilog. A daemon that answers,
# however it was started (systemd, the site's own supervisor), is enough; else systemd is
# asked to start it. Never fails the job: slurmd runs this with no PATH, as root.
sock="${COMMTAP_SOCKET:-/run/commtap/commtap.sock}"
timeout 10 commtap ps --from "unix://$sock" > /dev/null 2>&1 && exit 0
if [ -d /run/systemd/system ] && systemctl start commtap; then
    # Started is not probing yet (the unit is Type=simple): the daemon serves its socket
    # once its probes are in place. Wait for that (bounded), so that the job's first calls
    # are counted.
    i=0
    while [ "$i" -lt 30 ]; do
        timeout 10 commtap ps --from "unix://$sock" > /dev/null 2>&1 && exit 0
        sleep 0.5
        i=$((i + 1))
    done
fi
echo "commtap: no daemon answers on $sock and systemd could not start one: job $SLURM_JOB_ID is not profiled" >&2
exit 0
