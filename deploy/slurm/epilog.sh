#!/bin/sh
# Slurm Epilog (slurm.conf: Epilog=/usr/share/commtap/slurm/epilog.sh): writes the job's final
# profile from this node's daemon: mpitrace files (mpi_profile.<job>.<rank>) and JSON,
# readable by the job's user only (the epilog runs as root; SLURM_JOB_UID is the job's
# owner). A job that made no MPI call on this node leaves nothing. Never fails the job:
# profiling problems are logged, not fatal (slurmd runs this with no PATH, as root).
umask 077
case "$SLURM_JOB_ID" in
    ''|*[!0-9_]*) echo "commtap: unexpected job id '$SLURM_JOB_ID': no report" >&2; exit 0 ;;
esac
base="${COMMTAP_REPORT_DIR:-/var/log/commtap}"
# The base only to pass through (0711): each user reaches their own job's directory, and
# no one lists the others'.
[ -d "$base" ] || mkdir -p -m 0711 "$base" || exit 0
out="$base/$SLURM_JOB_ID/$(hostname -s)"
mkdir -p "$out" || exit 0
err=$(timeout 60 commtap report --from "unix://${COMMTAP_SOCKET:-/run/commtap/commtap.sock}" \
    --job "$SLURM_JOB_ID" --mpitrace-dir "$out" --json "$out/profile.json" \
    -o "$out/report.txt" 2>&1)
case $? in
    0) ;;
    # Not an MPI job here: said by nothing, left behind by nothing.
    3) rmdir "$out" "$base/$SLURM_JOB_ID" 2> /dev/null; exit 0 ;;
    *) echo "commtap: no profile for job $SLURM_JOB_ID on $(hostname -s): $err" >&2 ;;
esac
if [ -n "$SLURM_JOB_UID" ]; then
    chown -R "$SLURM_JOB_UID${SLURM_JOB_GID:+:$SLURM_JOB_GID}" "$base/$SLURM_JOB_ID" \
        || echo "commtap: reports of job $SLURM_JOB_ID not handed to uid $SLURM_JOB_UID" >&2
fi
exit 0
