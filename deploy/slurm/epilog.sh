#!/bin/sh
# Slurm Epilog (slurm.conf: Epilog=/etc/slurm/commtap-epilog.sh): writes the job's final
# profile from this node's daemon: mpitrace files (mpi_profile.<job>.<rank>) and JSON.
# Never fails the job: profiling problems are logged, not fatal.
out="${COMMTAP_REPORT_DIR:-/var/log/commtap}/$SLURM_JOB_ID/$(hostname -s)"
mkdir -p "$out" || exit 0
commtap report --from unix:///run/commtap/commtap.sock --job "$SLURM_JOB_ID" \
    --mpitrace-dir "$out" --json "$out/profile.json" -o "$out/report.txt" \
    || echo "commtap: no profile for job $SLURM_JOB_ID on $(hostname -s)" >&2
exit 0
