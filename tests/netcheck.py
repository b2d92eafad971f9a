"""Run a command where every packet it sends is seen; print those that would leave the machine.

    unshare --user --map-root-user --net python tests/netcheck.py -- CMD [ARGS...]

Inside a fresh network namespace, this brings the loopback device up and gives the
namespace what a connected machine has: an Ethernet device (one end of a veth pair) with
an address and a default route, IPv4 and IPv6, whose gateway's address is fixed so that
a packet for any host is really sent (software that first checks for a network, as
onnxruntime's telemetry does, sees one). Nothing is at the other end. It captures every
packet on every device with a raw socket while CMD runs, and prints one JSON line: CMD's
exit status and the packets bound past loopback or for a DNS port (53, also on a loopback
resolver such as 127.0.0.53): [proto, destination, port]. Used by tests/deploy/test_serve.py;
it needs no root outside the namespace.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import struct
import subprocess
import sys
import threading

ETH_P_ALL = 0x0003
DNS = 53


def outside(packet: bytes) -> tuple[str, str, int] | None:
    """(proto, destination, port) of an Ethernet frame if it leaves loopback or is DNS."""
    kind = struct.unpack("!H", packet[12:14])[0]
    ip = packet[14:]
    if kind == 0x0800 and len(ip) >= 20:
        proto, dst, header = ip[9], ipaddress.ip_address(ip[16:20]), (ip[0] & 0x0F) * 4
    elif kind == 0x86DD and len(ip) >= 48:
        proto, dst, header = ip[6], ipaddress.ip_address(ip[24:40]), 40
        if proto == 0:  # hop-by-hop options (the kernel's multicast listener reports)
            proto, header = ip[40], 40 + (ip[41] + 1) * 8
    else:
        return None
    name = {6: "tcp", 17: "udp", 1: "icmp", 58: "icmp6"}.get(proto, str(proto))
    port = struct.unpack("!H", ip[header + 2:header + 4])[0] if proto in (6, 17) and len(ip) >= header + 4 else 0
    if proto in (1, 58):
        return None  # ICMP: the kernel's own (neighbour discovery, listener reports, unreachable)
    if not dst.is_loopback or port == DNS:
        return name, str(dst), port
    return None


def main() -> None:
    cmd = sys.argv[sys.argv.index("--") + 1:]
    gateway = "02:00:00:00:00:02"  # a made-up address: frames for it go out and nowhere
    for step in ("link set lo up", "link add veth0 type veth peer name veth1",
                 "addr add 10.200.0.1/24 dev veth0", "-6 addr add fd00::1/64 dev veth0 nodad",
                 "link set veth0 up", "link set veth1 up",
                 "route add default via 10.200.0.2 dev veth0",
                 f"neigh add 10.200.0.2 lladdr {gateway} dev veth0",
                 "-6 route add default via fd00::2 dev veth0",
                 f"-6 neigh add fd00::2 lladdr {gateway} dev veth0"):
        subprocess.run(["ip", *step.split()], check=True)
    sniffer = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sniffer.settimeout(0.2)
    seen: list[tuple[str, str, int]] = []
    done = threading.Event()

    def capture() -> None:
        while not done.is_set():
            try:
                packet = sniffer.recv(65535)
            except TimeoutError:
                continue
            if (found := outside(packet)) and found not in seen:
                seen.append(found)

    thread = threading.Thread(target=capture, daemon=True)
    thread.start()
    status = subprocess.run(cmd).returncode
    done.set()
    thread.join(5)
    print(json.dumps({"status": status, "outside": seen}), flush=True)


if __name__ == "__main__":
    main()
