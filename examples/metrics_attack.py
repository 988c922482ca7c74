#!/usr/bin/env python3
"""Hostile clients against a running gpu-trace --metrics endpoint (issue 26), loopback only.

    python3 examples/metrics_attack.py HOST:PORT PID

Each attack is bounded in count and time. After each one: the tracer (PID) is still alive, a
GET /metrics answers 200 within 10 s, and its thread count and resident memory are printed. Exit
status: the number of attacks after which the endpoint or the tracer was gone."""
import socket, sys, time

host, port = sys.argv[1].rsplit(":", 1)
port = int(port)
pid = int(sys.argv[2])


def status_of(pid):
    fields = {}
    for line in open(f"/proc/{pid}/status"):
        k, _, v = line.partition(":")
        fields[k] = v.strip()
    return fields.get("Threads"), fields.get("VmRSS")


def scrape():
    s = socket.create_connection((host, port), timeout=10)
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    s.close()
    return data


def send(head, body=b"", wait=2.0):
    s = socket.create_connection((host, port), timeout=wait)
    try:
        s.sendall(head + body)
        return s.recv(200)
    except OSError as e:
        return repr(e).encode()
    finally:
        s.close()


def big_header():
    s = socket.create_connection((host, port), timeout=5)
    sent = 0
    try:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: ")
        chunk = b"a" * 65536
        while sent < 64 << 20:
            s.sendall(chunk)
            sent += len(chunk)
    except OSError:
        pass
    finally:
        s.close()
    return f"server stopped reading after {sent >> 10} KiB".encode()


attacks = [
    ("Content-Length 100000000000",
     lambda: send(b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000000\r\n\r\n", b"x")),
    ("Content-Length 18446744073709551615",
     lambda: send(b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 18446744073709551615\r\n\r\n", b"x")),
    ("64 MiB header line", big_header),
]
bad = 0
print(f"before: threads={status_of(pid)[0]} rss={status_of(pid)[1]}")
for name, attack in attacks:
    answer = attack()
    try:
        ok = scrape().startswith(b"HTTP/1.1 200")
    except OSError as e:
        ok = False
    threads, rss = status_of(pid)
    print(f"{'ok ' if ok else 'BAD'} {name}: answer {answer[:40]!r}; then GET /metrics 200: {ok}; "
          f"threads={threads} rss={rss}")
    bad += not ok
# 300 idle connections opened and left silent: the server holds at most 32 (the others are
# closed at once) and closes a silent one after its 5 s header timeout, so a scrape answers
# again after that; the tracer's threads do not grow.
idle = []
for _ in range(300):
    try:
        idle.append(socket.create_connection((host, port), timeout=2))
    except OSError:
        break
time.sleep(1)
threads_held, rss_held = status_of(pid)
time.sleep(6)
try:
    ok = b"gpu_trace_" in scrape()
except OSError:
    ok = False
threads, rss = status_of(pid)
print(f"{'ok ' if ok else 'BAD'} 300 silent connections: while held threads={threads_held} "
      f"rss={rss_held}; 7 s later GET /metrics answered: {ok}; threads={threads} rss={rss} "
      f"(opened: {len(idle)})")
bad += not ok
for s in idle:
    s.close()
sys.exit(bad)
