#!/usr/bin/env bash
# Baton's processes on a worker, run by the cluster YAML's
# worker_start_ray_commands before `ray start --address=$RAY_HEAD_IP:6379`:
#   - writes the workers' Mooncake JSON ($BATON_NODE_DIR/mooncake.json, the
#     path `baton deploy` gives the engines as MOONCAKE_CONFIG_PATH), pointing
#     at the head's master and metadata server;
#   - starts this node's Mooncake store (mooncake_client): it contributes
#     BATON_STORE_SEGMENT (default mooncake.global_segment_size) of memory,
#     and the NVMe directory when mooncake.enable_offload is true.
# --ray-start also starts the raylet, with the custom resource of this
# node's role (on-prem, where Ray passes no per-type resources): the role
# comes from BATON_NODE_ROLE, else from BATON_ROLES ("ip=role,ip=role"),
# else from the GPU model (H100/H200/A100/B200 -> prefill, others -> decode);
# BATON_ROLE_SEGMENTS ("prefill=512GB,decode=48GB") sizes the store by role
# when the node type sets no BATON_STORE_SEGMENT.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
. "$HERE/common.sh"

RAY_START=false
for arg in "$@"; do
    case $arg in
        --ray-start) RAY_START=true ;;
        *) die "unknown argument $arg (usage: worker_start.sh [--ray-start])" ;;
    esac
done

HEAD_IP=${RAY_HEAD_IP:?RAY_HEAD_IP is not set (Ray sets it for worker commands)}
ME=$(node_ip)
mkdir -p "$BATON_NODE_DIR"
write_worker_json "$HEAD_IP" "$BATON_NODE_DIR/mooncake.json"

gpu_model() { nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1; }

node_role() {
    if [ -n "${BATON_NODE_ROLE:-}" ]; then echo "$BATON_NODE_ROLE"; return; fi
    local pair roles=${BATON_ROLES:-}
    for pair in ${roles//,/ }; do
        if [ "${pair%%=*}" = "$ME" ]; then echo "${pair#*=}"; return; fi
    done
    case $(gpu_model) in
        *H100* | *H200* | *A100* | *B200*) echo prefill ;;
        *) echo decode ;;
    esac
}

ROLE=$(node_role)
case $ROLE in prefill | decode) ;; *) die "unknown role '$ROLE' (prefill or decode)" ;; esac
if [ -z "${BATON_STORE_SEGMENT:-}" ]; then
    # BATON_ROLE_SEGMENTS="prefill=512GB,decode=48GB": store memory per role (on-prem).
    segments=${BATON_ROLE_SEGMENTS:-}
    for pair in ${segments//,/ }; do
        [ "${pair%%=*}" = "$ROLE" ] && BATON_STORE_SEGMENT=${pair#*=}
    done
fi
load_config_env "$HEAD_IP"
log "worker $ME, head $HEAD_IP, role $ROLE"
start_store "$HEAD_IP" "$ME"

if [ "$RAY_START" = true ]; then
    role=$ROLE
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
    slots=${BATON_ROLE_SLOTS:-$((gpus > 0 ? gpus : 1))}
    log "ray start as $role ($slots slot(s))"
    "$(venv_bin ray)" stop || true
    ulimit -n 65536 || true
    exec env RAY_worker_niceness=0 "$(venv_bin ray)" start --address="$HEAD_IP:6379" --object-manager-port=8076 \
        --resources="{\"$role\": $slots}"
fi
