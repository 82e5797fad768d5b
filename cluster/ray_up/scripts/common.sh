# Shared helpers for Baton's node scripts (sourced, not run).
#
# Every port comes from the Baton config ($BATON_CONFIG, by default
# cluster/ray_up/baton/cluster.yaml in the repository the cluster YAML mounts
# at ~/baton) through node_env.py, so the processes started here and
# `baton deploy --config` the same file never disagree about a port.

BATON_HOME=${BATON_HOME:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)}
BATON_VENV=${BATON_VENV:-$BATON_HOME/.venv}
BATON_CONFIG=${BATON_CONFIG:-$BATON_HOME/cluster/ray_up/baton/cluster.yaml}
# Node-local state: pid files, logs and the workers' Mooncake JSON. The same
# path on every node; `baton deploy --worker-config` defaults to
# $BATON_NODE_DIR/mooncake.json.
BATON_NODE_DIR=${BATON_NODE_DIR:-/tmp/baton}
# Per-node-type settings (BATON_NODE_ROLE, BATON_STORE_SEGMENT, ...) written
# by the node type's setup commands.
BATON_NODE_ENV=${BATON_NODE_ENV:-$HOME/.baton-node.env}
# shellcheck disable=SC1090
[ -f "$BATON_NODE_ENV" ] && . "$BATON_NODE_ENV"

log() { echo "[baton $(date +%H:%M:%S)] $*" >&2; }
die() { log "error: $*"; exit 1; }

# This node's private IP: the address Ray itself would pick.
node_ip() {
    if [ -n "${BATON_NODE_IP:-}" ]; then echo "$BATON_NODE_IP"; return; fi
    "$BATON_VENV/bin/python" -c 'import ray._private.services as s; print(s.get_node_ip_address())' 2>/dev/null \
        || hostname -I | awk '{print $1}'
}

# A binary from the venv (mooncake_master, mooncake_client, ray) or PATH.
venv_bin() {
    if [ -x "$BATON_VENV/bin/$1" ]; then echo "$BATON_VENV/bin/$1"; return; fi
    command -v "$1" || die "$1 not found (run cluster/ray_up/scripts/setup_node.sh first)"
}

# Exports BATON_*/MOONCAKE_* port and size variables read from $BATON_CONFIG.
# $1: the head's IP (what loopback hosts in the config stand for).
load_config_env() {
    local cfg_arg=()
    [ -f "$BATON_CONFIG" ] && cfg_arg=(--config "$BATON_CONFIG")
    local out
    out=$("$BATON_VENV/bin/python" "$BATON_HOME/cluster/ray_up/scripts/node_env.py" \
        "${cfg_arg[@]}" --head-ip "$1") || die "cannot read the Baton config $BATON_CONFIG"
    eval "$out"
}

# write_worker_json HEAD_IP PATH: the workers' Mooncake JSON, from the config.
write_worker_json() {
    local cfg_arg=()
    [ -f "$BATON_CONFIG" ] && cfg_arg=(--config "$BATON_CONFIG")
    "$BATON_VENV/bin/python" "$BATON_HOME/cluster/ray_up/scripts/node_env.py" \
        "${cfg_arg[@]}" --head-ip "$1" --worker-json "$2" >/dev/null || die "cannot write $2"
    log "workers' Mooncake config: $2"
}

# Stops the supervisor recorded in $BATON_NODE_DIR/NAME.pid (start_daemon) and
# the process it runs, if they are still ours: TERM first, then KILL of the
# whole process group (setsid made the supervisor its leader).
stop_daemon() {
    local pidfile="$BATON_NODE_DIR/$1.pid" pid
    [ -f "$pidfile" ] || return 0
    pid=$(cat "$pidfile")
    if kill -0 "$pid" 2>/dev/null; then
        log "stopping $1 (pid $pid)"
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -9 -- "-$pid" 2>/dev/null || kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
}

# supervise NAME ARGV...: runs ARGV, and again whenever it exits, at most
# once per BATON_RESTART_BACKOFF_S (5) seconds, as `baton up` revives its
# children (cluster/launcher.py): a killed Redis comes back with its
# append-only file, a Mooncake master or store comes back empty and the
# engines recompute meanwhile. A first run that exits by itself (not by a
# signal) within the backoff is a broken command, not a crash: the
# supervisor exits with its status. TERM stops both.
supervise() {
    local name=$1 child="" rc started runs=0 backoff=${BATON_RESTART_BACKOFF_S:-5}
    shift
    trap '[ -n "$child" ] && kill "$child" 2>/dev/null; [ -n "$child" ] && wait "$child"; exit 0' TERM INT
    while true; do
        started=$SECONDS
        runs=$((runs + 1))
        "$@" &
        child=$!
        rc=0
        wait "$child" || rc=$?
        if [ "$runs" -eq 1 ] && [ "$rc" -lt 128 ] && [ $((SECONDS - started)) -lt "$backoff" ]; then
            log "$name exited ($rc) right after its start; not restarting it"
            exit "$rc"
        fi
        log "$name exited ($rc); restarting it (restart $runs)"
        sleep $((started + backoff > SECONDS ? started + backoff - SECONDS : 0))
    done
}

# start_daemon NAME ARGV...: (re)starts ARGV in the background under
# `supervise`, detached from the SSH session, with its log in
# $BATON_NODE_DIR/logs/NAME.log and the supervisor's PID in NAME.pid.
start_daemon() {
    local name=$1; shift
    mkdir -p "$BATON_NODE_DIR/logs"
    stop_daemon "$name"
    log "starting $name: $*"
    nohup setsid bash -c '. "$0"; supervise "$@"' "${BASH_SOURCE[0]}" "$name" "$@" \
        >"$BATON_NODE_DIR/logs/$name.log" 2>&1 </dev/null &
    echo $! >"$BATON_NODE_DIR/$name.pid"
}

# wait_port NAME HOST PORT [TIMEOUT_S]: fails if nothing listens in time.
wait_port() {
    local name=$1 host=$2 port=$3 timeout=${4:-60} i
    for ((i = 0; i < timeout * 5; i++)); do
        if (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; then log "$name is up on $host:$port"; return 0; fi
        if ! kill -0 "$(cat "$BATON_NODE_DIR/$name.pid")" 2>/dev/null; then
            tail -n 20 "$BATON_NODE_DIR/logs/$name.log" >&2 || true
            die "$name exited; log: $BATON_NODE_DIR/logs/$name.log"
        fi
        sleep 0.2
    done
    die "$name is not listening on $host:$port after ${timeout}s; log: $BATON_NODE_DIR/logs/$name.log"
}

# pin_env IP: the `env ...` words that pin a process's wildcard binds to IP
# (cluster/loopback: Mooncake's servers bind 0.0.0.0 whatever their flags say,
# so a preloaded shim moves them onto the node's private IP or loopback).
pin_env() {
    local lib=$BATON_VENV/lib/baton/libbaton_bind_loopback.so
    [ -f "$lib" ] || "$BATON_VENV/bin/python" -c 'from cluster import loopback; loopback.build()' >/dev/null \
        || die "cannot build the bind shim $lib (make install builds it)"
    echo "env LD_PRELOAD=$lib BATON_BIND_ADDRESS=$1 MC_TCP_BIND_ADDRESS=$1"
}

# The Mooncake store (mooncake_client) of this node, pointing at the head's
# master and metadata server. $1: head IP, $2: this node's IP. Uses the
# variables set by load_config_env; BATON_STORE_SEGMENT (per node type)
# overrides mooncake.global_segment_size.
start_store() {
    local head=$1 me=$2 offload_env=()
    local segment=${BATON_STORE_SEGMENT:-$MOONCAKE_GLOBAL_SEGMENT_SIZE}
    local args=(
        "$(venv_bin mooncake_client)"
        "--master_server_address=$head:$MOONCAKE_MASTER_PORT"
        "--metadata_server=http://$head:$MOONCAKE_METADATA_PORT/metadata"
        "--global_segment_size=$segment"
        "--host=$me"
        "--port=$MOONCAKE_STORE_PORT"
        "--protocol=$MOONCAKE_PROTOCOL"
        "--enable_offload=$MOONCAKE_ENABLE_OFFLOAD"
        "--enable_http_server=true"
        "--http_port=$MOONCAKE_STORE_HTTP_PORT"
        "--logtostderr"
    )
    [ -n "$MOONCAKE_DEVICE_NAME" ] && args+=("--device_names=$MOONCAKE_DEVICE_NAME")
    if [ "$MOONCAKE_ENABLE_OFFLOAD" = true ]; then
        # NVMe tier: the node type's mount (setup_node.sh --nvme) wins over the config.
        local dir=${BATON_OFFLOAD_DIR:-$MOONCAKE_OFFLOAD_DIR}
        [ -n "$dir" ] || dir=$BATON_NODE_DIR/offload
        if ! mkdir -p "$dir" 2>/dev/null; then
            log "cannot create $dir (no NVMe mounted?); offload tier in $BATON_NODE_DIR/offload"
            dir=$BATON_NODE_DIR/offload
            mkdir -p "$dir"
        fi
        offload_env=(env "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH=$dir")
        log "store offload tier: $dir"
    fi
    local pin
    read -ra pin <<<"$(pin_env "$me")"
    start_daemon mooncake-store "${pin[@]}" "${offload_env[@]}" "${args[@]}"
    wait_port mooncake-store "$me" "$MOONCAKE_STORE_PORT" 60
}
