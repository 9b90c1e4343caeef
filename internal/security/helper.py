# space security probe helpers, run inside the sandbox (python3 stdlib only).
# Every attempt prints exactly one line: "BYPASS: ..." when it demonstrably
# got through, "BLOCKED: ..." when it observed the refusal (a proxy 403, a
# TLS alert, ENETUNREACH, a timeout...), "ERROR: ..." when the probe itself
# failed and cannot decide. The host side adds its own evidence (canary
# listeners, the audit log) and never trusts "BLOCKED" alone over it.
import os, socket, ssl, struct, sys, time, base64

E = os.environ
PROXY = ("127.0.0.1", 3128)
AH = E.get("ALLOWED_HOST", "")
AP = int(E.get("ALLOWED_PORT", "443"))
FB = E.get("FORBIDDEN", "other.test")
CP = int(E.get("CANARY_PORT", "9"))
CU = int(E.get("CANARY_UDP", "9"))
API = int(E.get("API_PORT", "0") or 0)
PID = E.get("PROBE_ID", "probe")
NONCE = E.get("NONCE", "n")
UB = E.get("UNBOUND", "")
UP = int(E.get("UNBOUND_PORT", "0") or 0)
RB = E.get("REBIND", "")
PH = E.get(E.get("SECRET_ENV", "SPACE_PROBE_TOKEN"), "")


def say(kind, msg):
    sys.stdout.write(kind + ": " + msg.replace("\n", " ")[:300] + "\n")
    sys.stdout.flush()


def attempt(label, fn, *a):
    try:
        kind, msg = fn(*a)
    except (OSError, ssl.SSLError) as e:  # socket errors, timeouts, TLS alerts
        kind, msg = "BLOCKED", "%s %s" % (type(e).__name__, e)
    except Exception as e:  # a bug in the probe: it cannot decide
        kind, msg = "ERROR", "%s %s" % (type(e).__name__, e)
    say(kind, label + ": " + msg)


def hp(h, p):
    if ":" in h and not h.startswith("["):
        h = "[" + h + "]"
    return "%s:%d" % (h, p)


def readhead(s):
    data = b""
    while b"\r\n\r\n" not in data and len(data) < 65536:
        c = s.recv(4096)
        if not c:
            break
        data += c
    return data


def readall(s, t=3):
    s.settimeout(t)
    data = b""
    try:
        while len(data) < (1 << 20):
            c = s.recv(65536)
            if not c:
                break
            data += c
    except (socket.timeout, OSError):
        pass
    return data


def first(resp):
    return resp.split(b"\r\n", 1)[0].decode("latin1") or "connection closed without an answer"


def code(resp):
    p = first(resp).split(" ")
    if len(p) > 1 and p[0].startswith("HTTP/") and p[1].isdigit():
        return int(p[1])
    return 0


def why(resp):
    for l in resp.split(b"\r\n"):
        if l.lower().startswith(b"x-space-egress:"):
            return " [" + l.decode("latin1").split(":", 1)[1].strip() + "]"
    return ""


def from_proxy(resp):
    return b"X-Space-Egress" in resp or b"space egress:" in resp


def proxy():
    return socket.create_connection(PROXY, timeout=5)


def connect(host, port=None, target=None):
    """CONNECT through the proxy; returns (socket, response head)."""
    s = proxy()
    t = target or hp(host, port)
    s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (t, t)).encode("utf-8", "surrogateescape"))
    return s, readhead(s)


def connect_verdict(host, port=None, target=None):
    s, head = connect(host, port, target)
    s.close()
    t = target or hp(host, port)
    if code(head) == 200:
        return "BYPASS", "proxy opened a tunnel to %r: %s" % (t, first(head))
    return "BLOCKED", "CONNECT %r: %s%s" % (t, first(head), why(head))


def raw(data, t=5):
    s = proxy()
    s.sendall(data)
    r = readall(s, t)
    s.close()
    return r


def refused(resp, what):
    """A request the proxy must refuse: any answer not from the proxy
    means it reached something beyond it."""
    if code(resp) == 0:
        return "BLOCKED", "%s: no HTTP answer (%r)" % (what, resp[:60])
    if from_proxy(resp):
        return "BLOCKED", "%s: %s%s" % (what, first(resp), why(resp))
    return "BYPASS", "%s: answered by something other than the proxy: %s" % (what, first(resp))


def get_abs(url, host_hdr, extra=""):
    return raw(("GET %s HTTP/1.1\r\nHost: %s\r\n%sConnection: close\r\n\r\n" % (url, host_hdr, extra)).encode("utf-8", "surrogateescape"))


def direct(host, port, fam=socket.AF_INET, t=3):
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(t)
    try:
        s.connect((host, port))
        s.sendall(("GET /%s HTTP/1.0\r\nHost: %s\r\n\r\n" % (PID, host)).encode())
        r = readall(s, 2)
    finally:
        s.close()
    loop = host.startswith("127.") or host == "::1"
    if loop:
        # The sandbox's own loopback is not the host's: only the host-side
        # canary (or the API's answer) proves a crossing.
        if b"space-canary" in r or b'"status"' in r:
            return "BYPASS", "direct %s reached a host service: %r" % (hp(host, port), r[:80])
        return "BLOCKED", "direct %s is the sandbox's own loopback (%r)" % (hp(host, port), r[:40])
    return "BYPASS", "direct TCP connection to %s established: %r" % (hp(host, port), r[:60])


def udp(host, port, payload, fam=socket.AF_INET, t=2):
    s = socket.socket(fam, socket.SOCK_DGRAM)
    s.settimeout(t)
    try:
        s.sendto(payload, (host, port))
        data, addr = s.recvfrom(4096)
    except socket.timeout:
        return "BLOCKED", "UDP to %s sent, no reply in %ds" % (hp(host, port), t)
    finally:
        s.close()
    return "BYPASS", "UDP reply from %s: %r" % (addr, data[:60])


def dnsq(name, qtype=1):
    hdr = struct.pack(">HHHHHH", 0x5350, 0x0100, 1, 0, 0, 0)
    q = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".") if p) + b"\0"
    return hdr + q + struct.pack(">HH", qtype, 1)


def tls(sock, sni):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx.wrap_socket(sock, server_hostname=sni)


def allowed_tunnel():
    s, head = connect(AH, AP)
    if code(head) != 200:
        raise RuntimeError("the allowed destination %s is not reachable (%s): cannot test" % (hp(AH, AP), first(head)))
    return s


def exfil_name(tag):
    return "%s-%s.%s.attacker.test" % (tag, NONCE, PID)
