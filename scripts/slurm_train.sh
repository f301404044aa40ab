#!/usr/bin/env bash
# tcsm train on several machines under Slurm: one torchrun per node, all joining one c10d rendezvous on the first
# node; torchrun starts one process per GPU and sets RANK / WORLD_SIZE / LOCAL_RANK, which tcsm reads (NCCL on
# GPUs, gloo on CPUs). Rank 0 alone writes logs, samples and whole-file checkpoints; with train.strategy=fsdp every
# rank writes its own shards, so RUN_DIR must be on a file system that all nodes share.
#
#   sbatch --nodes=2 scripts/slurm_train.sh -c text8-paper -o runs/text8-fsdp train.strategy=fsdp
#   sbatch --nodes=2 scripts/slurm_train.sh -o runs/text8-fsdp --resume      # continue (any node / GPU count)
#
# Arguments are those of `tcsm train`. Set GPUS_PER_NODE (default: the GPUs Slurm gave the job, else 1) and
# PORT (default 29500); TCSM_PYTHON picks the interpreter (default .venv/bin/python).
#SBATCH --job-name=tcsm
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
#SBATCH --output=%x-%j.out
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}"
PY=${TCSM_PYTHON:-.venv/bin/python}
NODES=${SLURM_JOB_NUM_NODES:-1}
if [[ -z "${GPUS_PER_NODE:-}" ]]; then
  GPUS_PER_NODE=${SLURM_GPUS_ON_NODE:-1}
fi
HEAD=$(scontrol show hostnames "${SLURM_JOB_NODELIST:-$(hostname)}" 2>/dev/null | head -n 1 || hostname)
PORT=${PORT:-29500}
echo "tcsm: $NODES node(s) x $GPUS_PER_NODE process(es), rendezvous at $HEAD:$PORT" >&2
# One task per node (srun); each runs torchrun, which waits until all $NODES agents have joined.
srun --kill-on-bad-exit=1 "$PY" -m torch.distributed.run \
  --nnodes="$NODES" \
  --nproc_per_node="$GPUS_PER_NODE" \
  --rdzv_backend=c10d \
  --rdzv_endpoint="$HEAD:$PORT" \
  --rdzv_id="tcsm-${SLURM_JOB_ID:-local}" \
  -m tcsm.cli train "$@"
