#!/bin/bash
# ns.sh CC cmd...: runs cmd in a fresh network namespace (lo up) with tcp_congestion_control=CC
ip link set lo up
sysctl -q -w net.ipv4.tcp_congestion_control=$1
shift
exec "$@"
