#!/usr/bin/env bash
# The cluster flow on one machine (cluster/ray_up/local.yaml, Ray's
# fake_multinode provider), in place of `ray up`, which cannot read this
# provider's defaults from the PyPI wheel (see local.yaml):
#   local_up.sh          runs local.yaml's head_start_ray_commands here:
#                        Redis, Mooncake master + one store, then a Ray head
#                        whose autoscaler adds fake prefill/decode nodes;
#   local_up.sh --down   stops this cluster's Ray processes (those of the
#                        session under $BATON_NODE_DIR/ray, and their
#                        children: never `ray stop`, which would stop every
#                        Ray on the machine), then what head_start.sh started.
# Then the deploy command it prints: `cluster.deploy --address` the GCS
# address in $BATON_NODE_DIR/ray/ray_current_cluster (`auto` only finds this
# cluster when it is the only Ray running here, as its address file is not
# /tmp/ray's), with RAY_AUTH_MODE=token (`ray start` turns token auth on).
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

# Stops the processes of the Ray session(s) under $1 (the head's --temp-dir)
# and their descendants (workers, agents, the fake nodes' raylets).
stop_ray_session() {
    python - "$1" <<'PY'
import sys, time, psutil
root = sys.argv[1].rstrip("/") + "/"
me = psutil.Process().pid
procs = {}
for p in psutil.process_iter(["pid", "cmdline"]):
    try:
        if p.pid != me and root in " ".join(p.info["cmdline"] or []):
            procs[p.pid] = p
            for c in p.children(recursive=True):
                procs[c.pid] = c
    except psutil.Error:
        pass
procs.pop(me, None)
for p in procs.values():
    try:
        p.terminate()
    except psutil.Error:
        pass
_, alive = psutil.wait_procs(list(procs.values()), timeout=15)
for p in alive:
    try:
        p.kill()
    except psutil.Error:
        pass
print(f"stopped {len(procs)} Ray process(es) of {root}", file=sys.stderr)
PY
}

if [ "${1:-}" = --down ]; then
    stop_ray_session "$BATON_NODE_DIR/ray" || true
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
GCS=$(cat "$BATON_NODE_DIR/ray/ray_current_cluster" 2>/dev/null || echo "<head>:6379")
log "next: RAY_AUTH_MODE=token python -m cluster.deploy --config $BATON_CONFIG --address $GCS --head-ip $RAY_HEAD_IP --worker-config $BATON_NODE_DIR/mooncake.json"
