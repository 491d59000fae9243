#!/usr/bin/env bash
# Multi-host test on one machine: two network namespaces ("hosts") joined by a veth pair, 2 ranks on each, Gloo over
# TCP across the veth link and Redis rendezvous (the server runs on host A). 4 ranks save; then 3 ranks (2 on A, 1 on
# B) load with a different sharding and check every value. Skips, saying why, where namespaces cannot be made.
#   netns_test.sh LAUNCH_BINARY WORKER_BINARY
set -uo pipefail
launch=$(readlink -f "$1")
worker=$(readlink -f "$2")

skip() {
  echo "SKIPPED: $*"
  exit 0
}
command -v ip >/dev/null || skip "iproute2 (ip) is not installed"
command -v redis-server >/dev/null || skip "redis-server is not installed"
command -v redis-cli >/dev/null || skip "redis-cli is not installed"

tag="dckpt$$"
nsa="${tag}a"
nsb="${tag}b"
# Addresses of this test's own namespaces; traffic never leaves them (so Redis may run without protected mode).
addr_a=10.213.$(( $$ % 200 + 10 )).1
addr_b=10.213.$(( $$ % 200 + 10 )).2
port=6380
workdir=$(mktemp -d "${TEST_TMPDIR:-/tmp}/netns-XXXXXX")

cleanup() {
  [[ -n "${redis_pid:-}" ]] && kill "$redis_pid" 2>/dev/null
  ip netns del "$nsa" 2>/dev/null
  ip netns del "$nsb" 2>/dev/null
  rm -rf "$workdir"
}
trap cleanup EXIT

ip netns add "$nsa" 2>"$workdir/err" || skip "cannot create network namespaces here: $(cat "$workdir/err")"
ip netns add "$nsb" || skip "cannot create a second network namespace"
ip link add "${tag}va" type veth peer name "${tag}vb" 2>"$workdir/err" || skip "cannot create a veth pair: $(cat "$workdir/err")"
ip link set "${tag}va" netns "$nsa"
ip link set "${tag}vb" netns "$nsb"
ip -n "$nsa" addr add "$addr_a/24" dev "${tag}va"
ip -n "$nsb" addr add "$addr_b/24" dev "${tag}vb"
for ns in "$nsa" "$nsb"; do ip -n "$ns" link set lo up; done
ip -n "$nsa" link set "${tag}va" up
ip -n "$nsb" link set "${tag}vb" up

ip netns exec "$nsa" redis-server --bind "$addr_a" --port "$port" --protected-mode no --save '' --appendonly no --daemonize no \
  >"$workdir/redis.log" 2>&1 &
redis_pid=$!
for _ in $(seq 50); do
  ip netns exec "$nsb" redis-cli -h "$addr_a" -p "$port" ping 2>/dev/null | grep -q PONG && break
  sleep 0.1
done
ip netns exec "$nsb" redis-cli -h "$addr_a" -p "$port" ping 2>/dev/null | grep -q PONG \
  || { echo "FAIL: host B cannot reach Redis on host A"; cat "$workdir/redis.log"; exit 1; }

# Runs one group: $1 ranks on host A, $2 on host B, then the worker arguments.
run_group() {
  local na=$1 nb=$2
  shift 2
  ip netns exec "$nsb" redis-cli -h "$addr_a" -p "$port" flushall >/dev/null
  local world=$((na + nb))
  ip netns exec "$nsa" env DCKPT_RENDEZVOUS="redis://$addr_a:$port" DCKPT_GLOO_HOSTNAME="$addr_a" \
    "$launch" -n "$na" --rank-offset 0 --group-size "$world" --timeout 120 -- "$worker" "$@" &
  local pa=$!
  ip netns exec "$nsb" env DCKPT_RENDEZVOUS="redis://$addr_a:$port" DCKPT_GLOO_HOSTNAME="$addr_b" \
    "$launch" -n "$nb" --rank-offset "$na" --group-size "$world" --timeout 120 -- "$worker" "$@" &
  local pb=$!
  local rc=0
  wait "$pa" || rc=1
  wait "$pb" || rc=1
  return $rc
}

ckpt="$workdir/ckpt"
run_group 2 2 --mode save --path "$ckpt" || { echo "FAIL: 2x2-rank save across namespaces"; exit 1; }
[[ -f "$ckpt/metadata.dckpt" ]] || { echo "FAIL: no committed checkpoint"; exit 1; }
run_group 2 1 --mode load --path "$ckpt" || { echo "FAIL: 3-rank resharded load across namespaces"; exit 1; }
echo "PASSED: 4 ranks on 2 hosts saved over Gloo/TCP with Redis rendezvous; 3 ranks loaded and checked every value"
