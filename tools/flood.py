#!/usr/bin/env python3
# Usage: tools/flood.py unix|tcp SOCKET_PATH|HOST:PORT N DAEMON_PID
# Issue 17: how many descriptors and how much memory a flood of peers that never
# authenticate makes the daemon hold (read from /proc/DAEMON_PID).
import socket, sys, time, os
kind, target, n, pid = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def fds():
    return len(os.listdir(f"/proc/{pid}/fd"))
def rss():
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("VmRSS"):
            return l.split()[1]
print("before:", fds(), "fds,", rss(), "kB RSS")
socks = []
for i in range(n):
    if kind == "unix":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.connect(target)
    else:
        h, p = target.rsplit(":", 1); s = socket.create_connection((h, int(p)))
    socks.append(s)
time.sleep(2.0)
print(f"after {n} {kind} connections that never authenticate: daemon holds", fds(), "fds,", rss(), "kB RSS")
