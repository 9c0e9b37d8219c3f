#!/bin/bash
# $1 tag
cd /work/main
export TPU_ACCELERATOR_TYPE=v6e-4 TPU_WORKER_HOSTNAMES=localhost
export PARITY_CACHE_DIR=$(mktemp -d -p $SCRATCH)
out=$SCRATCH/all-$1; rm -rf $out
/usr/bin/time -f "$1: %e s wall %U user %S sys" .venv/bin/parity all --suite smoke --out $out --no-progress > $SCRATCH/all-$1.log 2>&1
echo "exit $?" >> $SCRATCH/all-$1.log
