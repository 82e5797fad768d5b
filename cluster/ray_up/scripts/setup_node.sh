#!/usr/bin/env bash
# Installs Baton on a node, run by the cluster YAML's setup commands from the
# repository that file_mounts copies to ~/baton:
#   setup_node.sh --extras gpu|cpu [--pip PKG]... [--role prefill|decode]
#                 [--store-segment SIZE] [--nvme]
# - Debian packages, Python 3.11, ~/baton/.venv with Baton and its extras
#   (`make install EXTRAS=...`, which also generates the default tiny model);
# - --pip: extra packages for the head's autoscaler (boto3 on AWS,
#   google-api-python-client on GCP);
# - --role / --store-segment: this node type's settings, written to
#   ~/.baton-node.env for worker_start.sh (role, store memory);
# - --nvme: formats (only if blank) and mounts the instance's local NVMe at
#   /mnt/baton-nvme for Mooncake's offload tier.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
. "$HERE/common.sh"

EXTRAS=cpu ROLE="" SEGMENT="" NVME=false PIP=()
while [ $# -gt 0 ]; do
    case $1 in
        --extras) EXTRAS=$2; shift 2 ;;
        --pip) PIP+=("$2"); shift 2 ;;
        --role) ROLE=$2; shift 2 ;;
        --store-segment) SEGMENT=$2; shift 2 ;;
        --nvme) NVME=true; shift ;;
        *) die "unknown argument $1" ;;
    esac
done
case $EXTRAS in cpu | gpu) ;; *) die "--extras must be cpu or gpu" ;; esac
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)

if ! command -v python3.11 >/dev/null; then
    log "installing Python 3.11"
    $SUDO apt-get update -qq
    if ! $SUDO DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3.11 python3.11-venv; then
        # Ubuntu releases without 3.11 in main get it from the deadsnakes PPA.
        $SUDO DEBIAN_FRONTEND=noninteractive apt-get install -y -qq software-properties-common
        $SUDO add-apt-repository -y ppa:deadsnakes/ppa
        $SUDO apt-get update -qq
        $SUDO DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3.11 python3.11-venv
    fi
fi

log "installing Baton (extras: $EXTRAS) in $BATON_VENV"
make -C "$BATON_HOME" install EXTRAS="$EXTRAS" PYTHON=python3.11
if [ ${#PIP[@]} -gt 0 ]; then
    "$BATON_VENV/bin/pip" install -q "${PIP[@]}"
fi
# `ray` on PATH for Ray's own commands (ray stop/start, the autoscaler).
grep -q 'baton/.venv/bin' "$HOME/.bashrc" 2>/dev/null \
    || echo "export PATH=\"$BATON_VENV/bin:\$PATH\"" >>"$HOME/.bashrc"
# Ray token authentication for every Ray process and driver of this node
# (ray start, the autoscaler, `baton deploy`), with the token the cluster YAML
# mounts from the launching machine (`baton secrets`; docs/security.md).
SECRETS=$HOME/.baton/secrets
[ -s "$SECRETS/ray_auth_token" ] && [ -s "$SECRETS/redis_password" ] \
    || die "$SECRETS/{ray_auth_token,redis_password} missing: run \`baton secrets\` before \`ray up\`"
chmod 700 "$SECRETS" && chmod 600 "$SECRETS"/*
grep -q 'RAY_AUTH_MODE=token' "$HOME/.bashrc" 2>/dev/null \
    || echo "export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=\"$SECRETS/ray_auth_token\"" >>"$HOME/.bashrc"

if [ "$NVME" = true ]; then
    mnt=/mnt/baton-nvme
    if ! mountpoint -q "$mnt"; then
        dev=""
        for cand in /dev/disk/by-id/nvme-Amazon_EC2_NVMe_Instance_Storage_* \
                    /dev/disk/by-id/google-local-nvme-ssd-0 /dev/disk/by-id/google-local-ssd-0; do
            [ -e "$cand" ] && { dev=$(readlink -f "$cand"); break; }
        done
        if [ -z "$dev" ]; then
            log "no local NVMe found; the offload tier stays in $BATON_NODE_DIR/offload"
        else
            if [ -z "$($SUDO blkid -o value -s TYPE "$dev" || true)" ]; then
                log "formatting $dev (blank) for the offload tier"
                $SUDO mkfs.ext4 -q -F "$dev"
            fi
            $SUDO mkdir -p "$mnt"
            $SUDO mount -o noatime "$dev" "$mnt"
            $SUDO chown "$(id -u):$(id -g)" "$mnt"
            log "NVMe $dev mounted at $mnt"
        fi
    fi
    mountpoint -q "$mnt" && NVME_DIR=$mnt/mooncake
fi

{
    echo "# written by setup_node.sh; read by worker_start.sh"
    [ -n "$ROLE" ] && echo "BATON_NODE_ROLE=$ROLE"
    [ -n "$SEGMENT" ] && echo "BATON_STORE_SEGMENT=$SEGMENT"
    [ -n "${NVME_DIR:-}" ] && echo "BATON_OFFLOAD_DIR=$NVME_DIR"
    true
} >"$BATON_NODE_ENV"
log "node setup done ($BATON_NODE_ENV)"
