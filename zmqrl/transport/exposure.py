"""What may bind where: plaintext sockets stay on this machine unless the user says otherwise.

:func:`is_loopback` decides whether an endpoint is reachable only from this machine (unknown means
no), and :func:`check_bind_allowed` refuses a plaintext bind beyond it unless ``--insecure``
(``transport.insecure``) is given, which then logs one warning per endpoint.
"""

from __future__ import annotations

import ipaddress
import logging
import threading

from zmqrl.transport.keys import KEYS_COMMAND, Security, SecurityError

log = logging.getLogger("zmqrl.security")

# Endpoint schemes that never leave this machine.
_LOCAL_SCHEMES = ("ipc://", "inproc://")
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "ip6-localhost", "ip6-loopback"})


def is_loopback(endpoint: str) -> bool:
    """Whether a ZeroMQ endpoint is reachable only from this machine.

    Unknown means no: hostnames other than localhost, interface names, wildcards and every other
    transport count as exposed, so a doubtful case asks for keys rather than silently going out.
    """
    text = endpoint.strip()
    lower = text.lower()
    if lower.startswith(_LOCAL_SCHEMES):
        return True
    if not lower.startswith("tcp://"):
        return False
    address = text[len("tcp://") :]
    if ";" in address:  # "source;destination" (connect only): the destination decides
        address = address.rsplit(";", 1)[1]
    if address.startswith("["):
        host = address[1 : address.find("]")] if "]" in address else address[1:]
    else:
        host = address.rsplit(":", 1)[0] if address.count(":") == 1 else address
    host = host.split("%", 1)[0]  # an IPv6 zone id ("fe80::1%eth0") is not part of the address
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


_warned: set[str] = set()
_warned_lock = threading.Lock()


def check_bind_allowed(endpoint: str, what: str, security: Security | None, insecure: bool) -> None:
    """Refuse to expose a plaintext socket beyond this machine unless the user said so.

    Loopback and secured binds pass silently. A plaintext bind elsewhere raises, or with
    ``insecure`` logs one warning per endpoint (restarts would otherwise repeat it).
    """
    if security is not None or is_loopback(endpoint):
        return
    if not insecure:
        raise SecurityError(
            f"binding {what} on {endpoint} exposes it beyond this machine unencrypted and "
            f"unauthenticated: make keys with `{KEYS_COMMAND} DIR` and set transport.keys_dir=DIR, "
            f"or pass --insecure on a trusted network"
        )
    with _warned_lock:
        if endpoint in _warned:
            return
        _warned.add(endpoint)
    log.warning(
        "binding %s on %s without encryption or authentication (--insecure): anyone who can reach "
        "this address can read the traffic and send data to this run",
        what,
        endpoint,
    )
