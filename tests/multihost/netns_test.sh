#!/usr/bin/env bash
# Multi-host tests on one machine: network namespaces ("hosts") plugged into a bridge in a namespace of its own (the
# "switch") by veth pairs, Gloo over TCP between them, Redis rendezvous (the server runs on host A).
#  1. 4 ranks (2 on A, 2 on B) save; then 3 ranks (2 on A, 1 on B) load with a different sharding and check every
#     value.
#  2. The checkpoint manager: 2 ranks on A and 2 on B, each host with its own tier directory, save steps 1..4 with
#     replicas=1 (2 and 4 persisted). Host B is then removed while the job runs: its ranks killed (SIGKILL), its tier
#     directory deleted, its namespace deleted. A new job (2 ranks on A, 2 on host C, a replacement namespace with an
#     empty tier) restores step 4 with every value exact, nothing from persistent storage, and host C's ranks getting
#     their bytes from host A's replicas.
# Skips, saying why, where namespaces cannot be made.
#   netns_test.sh LAUNCH_BINARY RESHARD_WORKER MANAGER_WORKER
set -uo pipefail
launch=$(readlink -f "$1")
worker=$(readlink -f "$2")
manager_worker=$(readlink -f "$3")

skip() {
  echo "SKIPPED: $*"
  exit 0
}
command -v ip >/dev/null || skip "iproute2 (ip) is not installed"
command -v redis-server >/dev/null || skip "redis-server is not installed"
command -v redis-cli >/dev/null || skip "redis-cli is not installed"

tag="dckpt$$"
nss="${tag}s"  # the switch
subnet=10.213.$(( $$ % 200 + 10 ))
# Addresses of this test's own namespaces; traffic never leaves them (so Redis may run without protected mode).
addr_a=$subnet.1
port=6380
workdir=$(mktemp -d "${TEST_TMPDIR:-/tmp}/netns-XXXXXX") || { echo "$0: mktemp failed (is the disk full?)" >&2; exit 1; }
hosts=()

cleanup() {
  [[ -n "${redis_pid:-}" ]] && kill "$redis_pid" 2>/dev/null
  for pid in $(cat "$workdir"/ready.* 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
  for h in "${hosts[@]}"; do ip netns del "$tag$h" 2>/dev/null; done
  ip netns del "$nss" 2>/dev/null
  rm -rf "$workdir"
}
trap cleanup EXIT

ip netns add "$nss" 2>"$workdir/err" || skip "cannot create network namespaces here: $(cat "$workdir/err")"
ip -n "$nss" link add br0 type bridge 2>"$workdir/err" || skip "cannot create a bridge: $(cat "$workdir/err")"
ip -n "$nss" link set br0 up

# add_host NAME ADDRESS: a namespace $tag$NAME whose veth joins the switch's bridge, at ADDRESS/24.
add_host() {
  local ns="$tag$1"
  ip netns add "$ns" || return 1
  hosts+=("$1")
  ip link add "${tag}$1h" type veth peer name "${tag}$1s" 2>"$workdir/err" || return 1
  ip link set "${tag}$1h" netns "$ns"
  ip link set "${tag}$1s" netns "$nss"
  ip -n "$nss" link set "${tag}$1s" master br0
  ip -n "$nss" link set "${tag}$1s" up
  ip -n "$ns" addr add "$2/24" dev "${tag}$1h"
  ip -n "$ns" link set lo up
  ip -n "$ns" link set "${tag}$1h" up
}
add_host a "$addr_a" || skip "cannot create a host namespace with a veth pair: $(cat "$workdir/err")"
add_host b "$subnet.2" || skip "cannot create a second host namespace: $(cat "$workdir/err")"

ip netns exec "${tag}a" redis-server --bind "$addr_a" --port "$port" --protected-mode no --save '' --appendonly no \
  --daemonize no >"$workdir/redis.log" 2>&1 &
redis_pid=$!
# reaches_redis NAME: host NAME can talk to Redis on host A (waits up to 5 s).
reaches_redis() {
  for _ in $(seq 50); do
    ip netns exec "$tag$1" redis-cli -h "$addr_a" -p "$port" ping 2>/dev/null | grep -q PONG && return 0
    sleep 0.1
  done
  echo "FAIL: host $1 cannot reach Redis on host A"
  cat "$workdir/redis.log"
  return 1
}
reaches_redis b || exit 1

# start_ranks HOST ADDRESS FIRST_RANK COUNT WORLD ARGS...: starts COUNT ranks on HOST in the background ($!: launch).
start_ranks() {
  local host=$1 addr=$2 first=$3 count=$4 world=$5
  shift 5
  ip netns exec "$tag$host" env DCKPT_RENDEZVOUS="redis://$addr_a:$port" DCKPT_GLOO_HOSTNAME="$addr" \
    "$launch" -n "$count" --rank-offset "$first" --group-size "$world" --timeout 120 -- "$@" &
}

# run_group NA NB ARGS...: NA ranks on host A and NB on host B, both waited for.
run_group() {
  local na=$1 nb=$2
  shift 2
  ip netns exec "${tag}a" redis-cli -h "$addr_a" -p "$port" flushall >/dev/null
  start_ranks a "$addr_a" 0 "$na" $((na + nb)) "$@"
  local pa=$!
  start_ranks b "$subnet.2" "$na" "$nb" $((na + nb)) "$@"
  local pb=$!
  local rc=0
  wait "$pa" || rc=1
  wait "$pb" || rc=1
  return $rc
}

ckpt="$workdir/ckpt"
run_group 2 2 "$worker" --mode save --path "$ckpt" || { echo "FAIL: 2x2-rank save across namespaces"; exit 1; }
[[ -f "$ckpt/metadata.dckpt" ]] || { echo "FAIL: no committed checkpoint"; exit 1; }
run_group 2 1 "$worker" --mode load --path "$ckpt" || { echo "FAIL: 3-rank resharded load across namespaces"; exit 1; }
echo "PASSED: 4 ranks on 2 hosts saved over Gloo/TCP with Redis rendezvous; 3 ranks loaded and checked every value"

# ---- The checkpoint manager: host B removed mid-run, restore on a replacement host C ----
steps=4
persistent="$workdir/persistent"
manager_args() {  # manager_args HOST: the worker's arguments on HOST (its own tier directory)
  echo --local "$workdir/tier-$1" --node "host-$1" --steps "$steps" --persistent "$persistent"
}
ip netns exec "${tag}a" redis-cli -h "$addr_a" -p "$port" flushall >/dev/null
# shellcheck disable=SC2046
start_ranks a "$addr_a" 0 2 4 "$manager_worker" --mode save $(manager_args a) --ready "$workdir/ready"
pa=$!
# shellcheck disable=SC2046
start_ranks b "$subnet.2" 2 2 4 "$manager_worker" --mode save $(manager_args b) --ready "$workdir/ready"
pb=$!
for _ in $(seq 1200); do  # every rank has saved every step (or a launcher ended: a rank failed)
  [[ $(ls "$workdir"/ready.? 2>/dev/null | wc -l) -eq 4 ]] && break
  kill -0 "$pa" 2>/dev/null && kill -0 "$pb" 2>/dev/null || break
  sleep 0.1
done
[[ $(ls "$workdir"/ready.? 2>/dev/null | wc -l) -eq 4 ]] || { echo "FAIL: the manager job did not save $steps steps"; exit 1; }
[[ -d "$persistent/step-0000000004" ]] || { echo "FAIL: step 4 was not persisted"; exit 1; }
# Host B goes: its ranks die, its tier and its namespace are gone. The job dies with it (host A's ranks too).
kill -9 "$(cat "$workdir/ready.2")" "$(cat "$workdir/ready.3")"
rm -rf "$workdir/tier-b"
ip netns del "${tag}b"
kill -9 "$(cat "$workdir/ready.0")" "$(cat "$workdir/ready.1")"
wait "$pa" "$pb" 2>/dev/null
rm -f "$workdir"/ready.?
add_host c "$subnet.3" || { echo "FAIL: cannot create the replacement host: $(cat "$workdir/err")"; exit 1; }
reaches_redis c || exit 1
ip netns exec "${tag}a" redis-cli -h "$addr_a" -p "$port" flushall >/dev/null
# shellcheck disable=SC2046
start_ranks a "$addr_a" 0 2 4 "$manager_worker" --mode restore $(manager_args a)
pa=$!
# shellcheck disable=SC2046
start_ranks c "$subnet.3" 2 2 4 "$manager_worker" --mode restore $(manager_args c) --expect-peers 1
pc=$!
rc=0
wait "$pa" || rc=1
wait "$pc" || rc=1
((rc == 0)) || { echo "FAIL: restoring on hosts A and C (replacing the removed B)"; exit 1; }
echo "PASSED: manager on hosts A and B (replicas=1), B removed (ranks killed, tier and namespace deleted); step" \
  "$steps restored on A and a new host C with every value exact, C's bytes from A's replicas, 0 from persistent storage"
