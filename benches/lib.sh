# Shell helpers of the bench scripts; sourced (`. benches/lib.sh`) after they
# cd to the repository root.

# A TCP port on 127.0.0.1 that is free now.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
