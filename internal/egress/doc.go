// Package egress owns the only way out of a sandbox: a host-side proxy that
// decides, per connection and per request, whether traffic may leave, and
// that holds credentials the sandbox never sees.
//
// # Shape
//
// Sandboxes have no network interface (gVisor --network=none: loopback only).
// Inside the sandbox the guest agent listens on 127.0.0.1:3128 and tunnels
// every accepted TCP connection to the host over its existing agent channel;
// processes get HTTP_PROXY, HTTPS_PROXY and ALL_PROXY=http://127.0.0.1:3128
// (and pip/npm/git configuration in templates). On the host each tunnelled
// connection is handed to [Proxy.ServeConn] with the sandbox id. This package
// is that host side as a library; transport wiring lives elsewhere.
//
// UDP, ICMP and raw sockets cannot leave by construction: there is no
// interface to send them on, and the tunnel carries only TCP streams that
// speak the HTTP proxy protocol. DNS is never answered inside the sandbox:
// names travel inside CONNECT lines and absolute URIs and are resolved here,
// on the host, and only after the policy has allowed them (no DNS tunnelling).
//
// # Decisions
//
// A connection speaks either "CONNECT host:port" or absolute-URI plain HTTP
// ("GET http://host/path"). For each:
//
//  1. A host containing a secret placeholder is refused (placeholder_leak).
//  2. IP literals in every spelling (dotted, bracketed IPv6, the inet_aton
//     forms 2130706433, 0x7f.1, 0177.0.0.1, 127.1) are refused unless a CIDR
//     rule in the policy allows them.
//  3. Names must match the policy: deny rules win; mode "deny" (the default)
//     refuses everything, "allowlist" needs an allow rule ("api.github.com"
//     exact, "*.pythonhosted.org" any subdomain but not the apex), "public"
//     allows any name on any port. Allow rules without ports mean 80 and 443;
//     deny rules without ports mean every port.
//  4. Allowed names are resolved on the host (Config.Hosts first, then
//     Config.Resolver). Addresses in loopback, RFC 1918, link-local, the
//     metadata address, CGNAT, 0.0.0.0/8, multicast, broadcast, reserved,
//     IPv6 ULA/link-local/loopback, and IPv4 embedded in IPv6 (mapped,
//     NAT64, 6to4) forms of those are refused unless Config.AllowCIDRs covers
//     them. The proxy dials the exact address it vetted and never resolves
//     again, so DNS rebinding cannot move a connection.
//  5. Inside a CONNECT tunnel the first bytes are sniffed: a TLS ClientHello
//     must carry SNI equal to the CONNECT host (no domain fronting, missing
//     SNI refused; refused with a TLS access_denied alert); HTTP must carry a
//     Host header equal to the CONNECT host and may not CONNECT again
//     (nested CONNECT). Ports 80 and 443 accept only TLS or HTTP. Other
//     explicitly allowed ports that do not look like TLS or HTTP (ssh) are
//     relayed as raw TCP to the vetted address, and so are tunnels whose
//     upstream speaks first (smtp; after Config.SniffTimeout the client and
//     the upstream race for the first byte). A slow client is never
//     relayed raw for being slow: its TLS is still checked and, when the
//     sandbox holds secrets, intercepted.
//  6. Plain HTTP requests must carry a Host header equal to the URI's host.
//     Every request on a keep-alive connection is decided again, so a policy
//     change applies to the next request.
//
// Refusals answer "403" with a short plain-text reason
// ("space egress: host:port refused: rule") so agents stop retrying. Every
// attempt, allowed or refused, becomes an audit [Record].
//
// # Secrets
//
// Secret values live only in the host process ([SecretStore] keeps them
// encrypted at rest with AES-256-GCM under a key file in the data dir). A
// sandbox's environment holds only a random placeholder per secret
// ([NewPlaceholder], minted per sandbox and per fork child), bound with
// [Proxy.BindSecrets]. When a sandbox has bound secrets, every TLS tunnel it
// opens, to any allowed host and port, is intercepted:
// the proxy terminates TLS with a per-sandbox CA ([Proxy.CAFor]; its
// certificate goes into the sandbox trust store, its key stays in the
// [CAStore]), offers only http/1.1 by ALPN, reads each HTTP/1.1 request,
// replaces the placeholder at the secret's configured place (a header with a
// format such as "Bearer {value}", basic-auth password, or a query
// parameter) and forwards over a verified TLS connection to the vetted
// upstream address, on the ports the secret's host entry names (443 when it
// names none). A placeholder seen anywhere it may not go (another host or
// port, plain HTTP, the CONNECT host) refuses the request and is audited as
// placeholder_leak. Responses from a secret's hosts are scrubbed of its
// value (scrub.go, scrub64.go, wsscrub.go); a request of the sandbox's own
// that carries the value is a guess: refused, and the secret revoked for
// the sandbox (guess.go). After a 101 only WebSocket frames pass, on the
// one upstream connection (wsclient.go). Request bodies are not searched
// for placeholders (only, toward a secret's hosts, for its value), and TLS
// tunnels of sandboxes without secrets (nothing to leak) are not
// inspected. The value never reaches logs, audit records or errors:
// [Secret] redacts itself for slog, fmt and JSON.
//
// # Limits
//
// A ClientHello split across several TLS records is refused (fail closed).
// HTTP/2 is not spoken inside intercepted tunnels. The CA key is kept
// encrypted in the CAStore directory (or only in memory when the store has
// no directory).
package egress
