# Shell helpers of the bench scripts; sourced (`. benches/lib.sh`) after they
# cd to the repository root.

# free_ports N: N distinct free loopback ports, one per line. All are held
# open until the last is picked: ports picked one at a time can repeat
# once the first is released (a sink and an admin server on one port).
free_ports() {
  python3 -c 'import socket, sys
held = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in held:
    s.bind(("127.0.0.1", 0))
print("\n".join(str(s.getsockname()[1]) for s in held))' "$1"
}

# wait_listening PORT PID: waits up to 10 s until 127.0.0.1:PORT accepts
# connections; fails at once when process PID has exited.
wait_listening() {
  for _ in $(seq 100); do
    kill -0 "$2" 2> /dev/null || return 1
    if python3 -c 'import socket, sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1).close()' "$1" 2> /dev/null; then
      return 0
    fi
    sleep 0.1
  done
  return 1
}

# start_collector BIN_DIR LOG_PREFIX [WORD...]: starts BIN_DIR's
# hermes-bench-sink and a hermes-collector exporting to it over OTLP/gRPC,
# the collector's command line after the WORDs (a wrapper such as valgrind
# and its options; none to run it as is), and waits up to 30 s for its
# /readyz. Writes ${LOG_PREFIX}sink.json (the sink's summary),
# ${LOG_PREFIX}sink.log and ${LOG_PREFIX}collector.log (stderr, the
# wrapper's too). With COLLECTOR_CONFIG set, the collector reads that
# configuration file (the endpoint still the sink's). Sets LISTEN (the
# collector's ingest port), SINK_PORT, SINK_PID and COLLECTOR_PID; stop both
# with stop_collector.
start_collector() {
  local bin=$1 prefix=$2 admin
  shift 2
  # A port found free can be taken before the sink binds it (an outgoing
  # connection's local port): then the sink exits, and it starts again on
  # other ports. The collector starts once the sink listens.
  local try
  for try in 1 2 3 4 5; do
    { read -r SINK_PORT; read -r LISTEN; read -r admin; } < <(free_ports 3)
    "$bin/hermes-bench-sink" --listen "127.0.0.1:$SINK_PORT" > "${prefix}sink.json" 2> "${prefix}sink.log" &
    SINK_PID=$!
    if wait_listening "$SINK_PORT" "$SINK_PID"; then
      break
    fi
    kill -TERM "$SINK_PID" 2> /dev/null || true
    if [[ $try == 5 ]]; then
      echo "the sink did not start: ${prefix}sink.log" >&2
      return 1
    fi
  done
  "$@" "$bin/hermes-collector" ${COLLECTOR_CONFIG:+--config "$COLLECTOR_CONFIG"} \
    --listen "127.0.0.1:$LISTEN" --admin-listen "127.0.0.1:$admin" \
    --otlp-endpoint "http://127.0.0.1:$SINK_PORT" 2> "${prefix}collector.log" &
  COLLECTOR_PID=$!
  for _ in $(seq 150); do
    if python3 -c 'import sys, urllib.request; urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/readyz", timeout=1)' "$admin" 2> /dev/null; then
      return 0
    fi
    sleep 0.2
  done
  echo "the collector did not become ready: ${prefix}collector.log" >&2
  stop_collector
  return 1
}

# Stops (SIGTERM) and reaps the collector and the sink of start_collector.
stop_collector() {
  kill -TERM "$COLLECTOR_PID" 2> /dev/null || true
  wait "$COLLECTOR_PID" || true
  kill -TERM "$SINK_PID" 2> /dev/null || true
  wait "$SINK_PID" || true
}
