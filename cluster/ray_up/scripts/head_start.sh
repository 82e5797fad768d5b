#!/usr/bin/env bash
# Baton's processes on the head, run by the cluster YAML's
# head_start_ray_commands before `ray start --head`:
#   - Redis (routing state: prefix index, session pins, replica registry),
#     on redis.url's port, reachable from the workers;
#   - the Mooncake master with its HTTP metadata server (master_port,
#     metadata_port, master_metrics_port).
# --with-store also runs a Mooncake store here (the one-machine flow,
# cluster/ray_up/local.yaml, whose workers share this machine and its store).
# Restarts what it started before (pid files in $BATON_NODE_DIR).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
. "$HERE/common.sh"

WITH_STORE=false
for arg in "$@"; do
    case $arg in
        --with-store) WITH_STORE=true ;;
        *) die "unknown argument $arg (usage: head_start.sh [--with-store])" ;;
    esac
done

HEAD_IP=${RAY_HEAD_IP:-$(node_ip)}
mkdir -p "$BATON_NODE_DIR"
load_config_env "$HEAD_IP"
log "head $HEAD_IP, config ${BATON_CONFIG}"

if [ "$BATON_REDIS_START" = true ]; then
    # Bound to the private IP and loopback, and with a password when the
    # config names a password file (redis.password_file; the cloud YAMLs do):
    # the password goes into a 0600 config file, never onto the command line.
    REDIS_BIND=("$HEAD_IP")
    [ "$HEAD_IP" = 127.0.0.1 ] || REDIS_BIND+=(127.0.0.1)
    REDIS_CONF=$BATON_NODE_DIR/redis.conf
    (umask 077 && : >"$REDIS_CONF")
    if [ -n "$BATON_REDIS_PASSWORD_FILE" ]; then
        [ -s "$BATON_REDIS_PASSWORD_FILE" ] || die "redis.password_file $BATON_REDIS_PASSWORD_FILE is missing or empty (baton secrets makes it)"
        printf 'requirepass "%s"\n' "$(tr -d '\n' <"$BATON_REDIS_PASSWORD_FILE")" >"$REDIS_CONF"
        log "redis requires the password in $BATON_REDIS_PASSWORD_FILE"
    else
        log "warning: redis without a password (set redis.password_file; docs/security.md)"
    fi
    # redis.appendfsync: an append-only file in the node directory, which a restart of this Redis
    # loads again; a head start begins empty, as `baton up` does (common/processes.py redis_argv)
    rm -rf "$BATON_NODE_DIR/appendonlydir"
    REDIS_AOF=(--appendonly no)
    # rewritten once doubled past 4mb, so that a restart loads it in a fraction of a second (common/processes.py AOF_REWRITE_MIN)
    [ "$BATON_REDIS_APPENDFSYNC" = off ] || REDIS_AOF=(--appendonly yes --appendfsync "$BATON_REDIS_APPENDFSYNC"
        --auto-aof-rewrite-percentage 100 --auto-aof-rewrite-min-size 4mb)
    start_daemon redis "$(command -v redis-server || die 'redis-server not installed')" "$REDIS_CONF" \
        --bind "${REDIS_BIND[@]}" --port "$BATON_REDIS_PORT" --protected-mode no \
        --save '' "${REDIS_AOF[@]}" --dir "$BATON_NODE_DIR"
    wait_port redis "$HEAD_IP" "$BATON_REDIS_PORT" 30
fi

read -ra PIN <<<"$(pin_env "$HEAD_IP")"
start_daemon mooncake-master "${PIN[@]}" "$(venv_bin mooncake_master)" \
    "--rpc_port=$MOONCAKE_MASTER_PORT" \
    "--rpc_address=$HEAD_IP" \
    "--enable_http_metadata_server=true" \
    "--http_metadata_server_host=$HEAD_IP" \
    "--http_metadata_server_port=$MOONCAKE_METADATA_PORT" \
    "--metrics_host=$HEAD_IP" \
    "--metrics_port=$MOONCAKE_MASTER_METRICS_PORT" \
    "--enable_offload=$MOONCAKE_ENABLE_OFFLOAD" \
    "--logtostderr"
wait_port mooncake-master "$HEAD_IP" "$MOONCAKE_MASTER_PORT" 60
wait_port mooncake-master "$HEAD_IP" "$MOONCAKE_METADATA_PORT" 30

if [ "$WITH_STORE" = true ]; then
    write_worker_json "$HEAD_IP" "$BATON_NODE_DIR/mooncake.json"
    start_store "$HEAD_IP" "$HEAD_IP"
fi
log "head services ready"
