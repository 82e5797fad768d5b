#!/usr/bin/env bash
# The cluster flow on one machine (cluster/ray_up/local.yaml, Ray's
# fake_multinode provider), in place of `ray up`, which cannot read this
# provider's defaults from the PyPI wheel (see local.yaml):
#   local_up.sh          runs local.yaml's head_start_ray_commands here:
#                        Redis, Mooncake master + one store, then a Ray head
#                        whose autoscaler adds fake prefill/decode nodes;
#   local_up.sh --down   ray stop, then stops what head_start.sh started.
# Then: baton deploy --config cluster/ray_up/baton/local.yaml --address auto
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
cd "$ROOT"
export BATON_HOME=$ROOT
export BATON_CONFIG=${BATON_CONFIG:-$ROOT/cluster/ray_up/baton/local.yaml}
export BATON_NODE_DIR=${BATON_NODE_DIR:-/tmp/baton}
export BATON_NODE_ENV=/dev/null          # no node-type settings on this machine
export RAY_FAKE_CLUSTER=1
# The v1 autoscaler monitor reads local.yaml as it is; v2 would run
# prepare_config on it and look for the defaults file the wheel lacks.
export RAY_enable_autoscaler_v2=0
export PATH="$ROOT/.venv/bin:$PATH"
# shellcheck source=common.sh
. "$ROOT/cluster/ray_up/scripts/common.sh"
# The address Ray picks for this machine: fake nodes join the GCS there.
RAY_HEAD_IP=$(node_ip)
export RAY_HEAD_IP
CLUSTER_YAML=${CLUSTER_YAML:-$ROOT/cluster/ray_up/local.yaml}

if [ "${1:-}" = --down ]; then
    ray stop || true
    for name in mooncake-store mooncake-master redis; do stop_daemon "$name"; done
    exit 0
fi
[ $# -eq 0 ] || die "usage: local_up.sh [--down]"

# The head's commands, exactly as written in the cluster YAML.
mapfile -t COMMANDS < <(python -c '
import sys, yaml
for cmd in yaml.safe_load(open(sys.argv[1]))["head_start_ray_commands"]:
    print(" ".join(cmd.split()))
' "$CLUSTER_YAML")
for cmd in "${COMMANDS[@]}"; do
    log "+ $cmd"
    bash -c "$cmd"
done
log "cluster up; fake worker nodes join within a minute (ray status)."
log "next: baton deploy --config $BATON_CONFIG --address auto"
