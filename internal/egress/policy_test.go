package egress

import (
	"context"
	"encoding/base64"
	"errors"
	"net"
	"net/netip"
	"testing"

	"github.com/spacesandbox/space/internal/errdefs"
)

func basicB64(u, p string) string { return base64.StdEncoding.EncodeToString([]byte(u + ":" + p)) }

func TestParsePolicy(t *testing.T) {
	p, err := ParsePolicy(" api.github.com, *.pythonhosted.org:443 ,pypi.org,203.0.113.0/24,[2001:db8::/32]:8443,2001:db8::1 ", "bad.pythonhosted.org")
	if err != nil {
		t.Fatal(err)
	}
	if p.Mode != ModeAllowlist || len(p.Allow) != 6 || len(p.Deny) != 1 {
		t.Fatalf("%+v", p)
	}
	if p.Allow[1].Ports[0] != 443 || p.Allow[4].Host != "2001:db8::/32" || p.Allow[4].Ports[0] != 8443 || p.Allow[5].Host != "2001:db8::1" {
		t.Errorf("%+v", p.Allow)
	}
	if p, _ := ParsePolicy("*", ""); p.Mode != ModePublic {
		t.Error("* is public")
	}
	if p, _ := ParsePolicy("", ""); p.Mode != ModeDeny {
		t.Error("empty is deny")
	}
	for _, bad := range []string{"a.*.com", "*", "*foo.com", "host:0", "host:70000", "host:x", "300.1.1.1/8", "0x7f.1", "2130706433", "bad host", "[::1", "a..b", "-a.com", "*.*.com"} {
		allow := bad
		if bad == "*" {
			allow = "a.com," + bad
		}
		if _, err := ParsePolicy(allow, ""); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ParsePolicy(%q) = %v, want invalid argument", bad, err)
		}
	}
	if err := (Policy{Mode: "open"}).Validate(); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("bad mode: %v", err)
	}
}

func TestPolicyDecisions(t *testing.T) {
	pub := []net.IP{net.ParseIP("93.184.216.34")}
	answers := map[string][]net.IP{
		"private.test":  {net.ParseIP("10.1.2.3")},
		"meta.test":     {net.ParseIP("169.254.169.254")},
		"cgnat.test":    {net.ParseIP("100.64.1.1")},
		"mapped.test":   {net.ParseIP("::ffff:127.0.0.1")},
		"ula.test":      {net.ParseIP("fd00::1")},
		"ll6.test":      {net.ParseIP("fe80::1")},
		"nat64.test":    {net.ParseIP("64:ff9b::a9fe:a9fe")},
		"zero.test":     {net.ParseIP("0.1.2.3")},
		"mcast.test":    {net.ParseIP("239.1.1.1")},
		"bcast.test":    {net.ParseIP("255.255.255.255")},
		"v6loop.test":   {net.ParseIP("::1")},
		"denied-ip.com": {net.ParseIP("198.51.100.5")},
	}
	res := &countingResolver{fn: func(h string, _ int) []net.IP {
		if ips, ok := answers[h]; ok {
			return ips
		}
		return pub
	}}
	p, _ := New(Config{Resolver: res})
	ctx := context.Background()
	check := func(allow, deny, host string, port int, want bool, reason string) {
		t.Helper()
		pol, err := ParsePolicy(allow, deny)
		if err != nil {
			t.Fatal(err)
		}
		p.SetPolicy("s", pol)
		d := p.decide(ctx, "s", host, port)
		if d.allow != want || (!want && reason != "" && d.reason != reason) {
			t.Errorf("allow=%q deny=%q %s:%d -> %+v, want allow=%v %s", allow, deny, host, port, d, want, reason)
		}
	}
	// Exact and wildcard.
	check("api.github.com", "", "api.github.com", 443, true, "")
	check("api.github.com", "", "API.GitHub.com.", 80, true, "")
	check("api.github.com", "", "github.com", 443, false, ReasonNotAllowed)
	check("api.github.com", "", "api.github.com", 22, false, ReasonNotAllowed)
	check("api.github.com:8443", "", "api.github.com", 443, false, ReasonNotAllowed)
	check("*.pythonhosted.org", "", "files.pythonhosted.org", 443, true, "")
	check("*.pythonhosted.org", "", "a.b.pythonhosted.org", 443, true, "")
	check("*.pythonhosted.org", "", "pythonhosted.org", 443, false, ReasonNotAllowed)
	check("*.pythonhosted.org", "", "evilpythonhosted.org", 443, false, ReasonNotAllowed)
	check("*.pythonhosted.org", "", "pythonhosted.org.evil.com", 443, false, ReasonNotAllowed)
	// Deny wins.
	check("*.example.com", "bad.example.com", "bad.example.com", 443, false, ReasonDenyRule)
	check("*.example.com", "bad.example.com", "good.example.com", 443, true, "")
	check("*", "bad.example.com", "bad.example.com", 8080, false, ReasonDenyRule)
	check("*", "198.51.100.0/24", "denied-ip.com", 443, false, ReasonDenyRule)
	// One trailing dot is the same name; two are no name (as
	// "bad.example.com." it missed the deny and was resolved).
	check("*", "bad.example.com", "bad.example.com.", 443, false, ReasonDenyRule)
	check("*", "*.example.com", "bad.example.com.", 443, false, ReasonDenyRule)
	check("*", "bad.example.com", "bad.example.com..", 443, false, ReasonInvalidHost)
	check("*", "*.example.com", "bad.example.com..", 443, false, ReasonInvalidHost)
	check("bad.example.com.", "", "bad.example.com", 443, true, "")
	check("*.example.com.", "", "x.example.com", 443, true, "")
	// Public: any name, any port; private still refused.
	check("*", "", "anything.example", 5432, true, "")
	check("", "", "anything.example", 443, false, ReasonNotAllowed)
	// IP literals in every spelling.
	for _, h := range []string{"93.184.216.34", "127.0.0.1", "2130706433", "0x7f000001", "0x7f.1", "0177.0.0.1", "127.1", "017700000001",
		"[::1]", "::1", "[::ffff:127.0.0.1]", "::ffff:7f00:1", "169.254.169.254", "[fe80::1%25eth0]", "fe80::1%eth0", "1.2.3.4.", "foo.123", "0x", "1.2.3.4.5", "[2001:db8::1]"} {
		check("*", "", h, 443, false, ReasonIPLiteral)
	}
	// CIDR rules allow literals, but private ranges stay refused.
	check("93.184.216.0/24", "", "93.184.216.34", 443, true, "")
	check("93.184.216.0/24", "", "1572395042", 443, true, "") // decimal of 93.184.216.34
	check("93.184.216.0/24", "", "93.184.217.1", 443, false, ReasonIPLiteral)
	check("0.0.0.0/0", "", "127.0.0.1", 443, false, ReasonPrivate)
	check("0.0.0.0/0", "", "0x7f.1", 443, false, ReasonPrivate)
	check("0.0.0.0/0", "", "[::ffff:169.254.169.254]", 443, false, ReasonPrivate)
	check("0.0.0.0/0", "93.184.216.34", "93.184.216.34", 443, false, ReasonDenyRule)
	// Private resolution.
	for h := range answers {
		if h != "denied-ip.com" {
			check("*", "", h, 443, false, ReasonPrivate)
		}
	}
	// Operator AllowCIDRs exempt a range.
	p2, _ := New(Config{Resolver: res, AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
	pol, _ := ParsePolicy("private.test", "")
	p2.SetPolicy("s", pol)
	if d := p2.decide(ctx, "s", "private.test", 443); !d.allow {
		t.Errorf("AllowCIDRs: %+v", d)
	}
}

func TestBlockedRange(t *testing.T) {
	for _, s := range []string{"127.0.0.1", "10.0.0.1", "172.16.5.4", "192.168.1.1", "169.254.169.254", "169.254.1.1", "100.64.0.1",
		"0.0.0.0", "224.0.0.1", "255.255.255.255", "::1", "::", "fc00::1", "fd12::1", "fe80::1", "ff02::1", "::ffff:10.0.0.1",
		"64:ff9b::7f00:1", "2002:7f00:1::1", "fd00:ec2::254", "240.0.0.1"} {
		if blockedRange(netip.MustParseAddr(s)) == "" {
			t.Errorf("%s not blocked", s)
		}
	}
	for _, s := range []string{"93.184.216.34", "8.8.8.8", "2606:4700::1111", "64:ff9b::808:808", "2002:808:808::1", "203.0.113.1"} {
		if n := blockedRange(netip.MustParseAddr(s)); n != "" {
			t.Errorf("%s blocked as %s", s, n)
		}
	}
	if blockedRange(netip.MustParseAddr("169.254.169.254")) != "metadata" {
		t.Error("metadata name")
	}
}

func TestParseIPLiteral(t *testing.T) {
	for in, want := range map[string]string{
		"2130706433": "127.0.0.1", "0x7f.1": "127.0.0.1", "0177.0.0.1": "127.0.0.1", "127.1": "127.0.0.1",
		"0x7f.0.0.1": "127.0.0.1", "10.0x10.1": "10.16.0.1", "[::1]": "::1", "1.2.3.4.": "1.2.3.4",
	} {
		a, ok := parseIPLiteral(in)
		if !ok || a.String() != want {
			t.Errorf("%s -> %v %v, want %s", in, a, ok, want)
		}
	}
	for _, in := range []string{"example.com", "a1.b2", "0x7g.com", "xn--bcher-kva.de"} {
		if _, ok := parseIPLiteral(in); ok {
			t.Errorf("%s treated as a literal", in)
		}
	}
	for _, in := range []string{"256.1.1.1", "1.2.3.4.5", "4294967296", "foo.99"} {
		if a, ok := parseIPLiteral(in); !ok || a.IsValid() {
			t.Errorf("%s -> %v %v, want malformed literal", in, a, ok)
		}
	}
}

// TestPortMissSaysWhy: a host an allow rule names, on a port it does not,
// is refused with the rule and its ports (not "not in the allow list", or
// for an address "without an allowing CIDR rule", which sent people looking
// for the wrong fix).
func TestPortMissSaysWhy(t *testing.T) {
	p, _ := New(Config{Resolver: &countingResolver{fn: func(string, int) []net.IP { return []net.IP{net.ParseIP("93.184.216.34")} }}})
	pol, err := ParsePolicy("a.test,203.0.113.0/24,b.test:8443", "")
	if err != nil {
		t.Fatal(err)
	}
	p.SetPolicy("s", pol)
	for _, c := range []struct {
		host string
		port int
		want string
	}{
		{"a.test", 8080, "port 8080 is not allowed: rule a.test allows ports 80,443"},
		{"203.0.113.9", 22, "port 22 is not allowed: rule 203.0.113.0/24 allows ports 80,443"},
		{"b.test", 443, "port 443 is not allowed: rule b.test allows ports 8443"},
		{"c.test", 443, "not in the allow list"},
		{"198.51.100.1", 443, "IP literal without an allowing CIDR rule"},
	} {
		d := p.decide(context.Background(), "s", c.host, c.port)
		if d.allow || d.rule != c.want {
			t.Errorf("%s:%d: allow %v, %q; want refused, %q", c.host, c.port, d.allow, d.rule, c.want)
		}
	}
}
