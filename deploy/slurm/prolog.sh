#!/bin/sh
# Slurm Prolog (slurm.conf: Prolog=/etc/slurm/commtap-prolog.sh). The node daemon counts
# every MPI process from its first call, so the prolog only makes sure it is running;
# the job is found by its SLURM_JOB_ID at epilog.
systemctl is-active --quiet commtap || systemctl start commtap || \
    echo "commtap: daemon not started; job $SLURM_JOB_ID is not profiled" >&2
exit 0
