package egress

import (
	"errors"
	"net/netip"
	"strconv"
	"strings"
)

// blockedRanges are refused after resolution (and for IP literals) unless
// Config.AllowCIDRs covers the address. Names are what refusals show.
var blockedRanges = func() []struct {
	p    netip.Prefix
	name string
} {
	list := []struct{ cidr, name string }{
		{"0.0.0.0/8", "this-network"},
		{"10.0.0.0/8", "private"},
		{"100.64.0.0/10", "cgnat"},
		{"127.0.0.0/8", "loopback"},
		{"169.254.169.254/32", "metadata"},
		{"169.254.0.0/16", "link-local"},
		{"172.16.0.0/12", "private"},
		{"192.0.0.0/24", "ietf-protocol"},
		{"192.168.0.0/16", "private"},
		{"198.18.0.0/15", "benchmarking"},
		{"224.0.0.0/4", "multicast"},
		{"255.255.255.255/32", "broadcast"},
		{"240.0.0.0/4", "reserved"},
		{"::/128", "unspecified"},
		{"::1/128", "loopback"},
		{"::/96", "ipv4-compatible"},
		{"100::/64", "discard"},
		{"fc00::/7", "ula"},
		{"fe80::/10", "link-local"},
		{"fec0::/10", "site-local"},
		{"ff00::/8", "multicast"},
		{"fd00:ec2::254/128", "metadata"},
	}
	out := make([]struct {
		p    netip.Prefix
		name string
	}, len(list))
	for i, l := range list {
		out[i].p = netip.MustParsePrefix(l.cidr)
		out[i].name = l.name
	}
	return out
}()

var (
	nat64   = netip.MustParsePrefix("64:ff9b::/96")
	nat64l  = netip.MustParsePrefix("64:ff9b:1::/48")
	sixTo4  = netip.MustParsePrefix("2002::/16")
	teredo  = netip.MustParsePrefix("2001::/32")
	errHost = errors.New("not a valid host name")
)

// blockedRange names the refused range a belongs to ("" if none). IPv4
// addresses embedded in IPv6 (mapped, NAT64, 6to4) are judged as IPv4.
func blockedRange(a netip.Addr) string {
	a = a.Unmap()
	if a.Is6() {
		b := a.As16()
		switch {
		case nat64.Contains(a):
			return blockedRange(netip.AddrFrom4([4]byte(b[12:16])))
		case nat64l.Contains(a):
			return "nat64"
		case sixTo4.Contains(a):
			if n := blockedRange(netip.AddrFrom4([4]byte(b[2:6]))); n != "" {
				return n
			}
		case teredo.Contains(a):
			return "teredo"
		}
	}
	for _, r := range blockedRanges {
		if r.p.Contains(a) {
			return r.name
		}
	}
	return ""
}

// parseIPLiteral reports whether host is an IP literal in any spelling a
// resolver or libc would accept: IPv4/IPv6 (bracketed or not, with a zone),
// and the inet_aton forms (1 to 4 parts, each decimal, 0-octal or 0x-hex:
// "2130706433", "0x7f.1", "0177.0.0.1", "127.1"). A host whose last label
// is numeric counts too (WHATWG URL rules treat it as IPv4). The address is
// invalid when the literal is malformed; such hosts are always refused.
func parseIPLiteral(host string) (netip.Addr, bool) {
	h := strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if a, err := netip.ParseAddr(h); err == nil {
		return a.WithZone(""), true
	}
	if strings.Contains(h, ":") {
		return netip.Addr{}, true // IPv6-ish garbage
	}
	h = strings.TrimSuffix(h, ".")
	parts := strings.Split(h, ".")
	if len(parts) == 0 || !isNumericLabel(parts[len(parts)-1]) {
		return netip.Addr{}, false
	}
	if len(parts) > 4 {
		return netip.Addr{}, true
	}
	vals := make([]uint64, len(parts))
	for i, p := range parts {
		v, ok := parseNumericLabel(p)
		if !ok {
			return netip.Addr{}, true
		}
		vals[i] = v
	}
	var v uint64
	last := len(vals) - 1
	for i := 0; i < last; i++ {
		if vals[i] > 255 {
			return netip.Addr{}, true
		}
		v |= vals[i] << (24 - 8*uint(i))
	}
	if vals[last] >= 1<<(8*uint(4-last)) {
		return netip.Addr{}, true
	}
	v |= vals[last]
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), true
}

func isNumericLabel(s string) bool {
	if s == "" {
		return false
	}
	if strings.HasPrefix(s, "0x") || strings.HasPrefix(s, "0X") {
		for _, c := range s[2:] {
			if !strings.ContainsRune("0123456789abcdefABCDEF", c) {
				return false
			}
		}
		return true
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func parseNumericLabel(s string) (uint64, bool) {
	if !isNumericLabel(s) {
		return 0, false
	}
	base, digits := 10, s
	switch {
	case strings.HasPrefix(s, "0x") || strings.HasPrefix(s, "0X"):
		base, digits = 16, s[2:]
		if digits == "" {
			return 0, true
		}
	case len(s) > 1 && s[0] == '0':
		base, digits = 8, s[1:]
	}
	v, err := strconv.ParseUint(digits, base, 32)
	return v, err == nil
}

// validHostname accepts LDH names (and '_') up to 253 bytes, without a
// trailing dot: callers pass the name normalizeHost (or a rule's parse)
// made canonical by dropping one. It does not drop one itself: then
// "evil.com.." was valid, and as "evil.com." missed a deny of evil.com.
func validHostname(h string) error {
	if h == "" || len(h) > 253 {
		return errHost
	}
	for _, l := range strings.Split(h, ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return errHost
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return errHost
			}
		}
	}
	return nil
}

// normalizeHost lower-cases and drops brackets and one trailing dot.
func normalizeHost(h string) string {
	h = strings.ToLower(h)
	if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
		return h[1 : len(h)-1]
	}
	return strings.TrimSuffix(h, ".")
}
