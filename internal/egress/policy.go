package egress

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/net/publicsuffix"

	"github.com/spacesandbox/space/internal/errdefs"
)

// Policy modes.
const (
	ModeDeny      = "deny"      // nothing leaves (the default)
	ModeAllowlist = "allowlist" // only names and CIDRs in Allow
	ModePublic    = "public"    // any name on any port (private addresses still refused)
)

// Policy says where one sandbox may connect. The zero value denies
// everything. Deny rules win over allow rules and over ModePublic.
type Policy struct {
	Mode  string `json:"mode"`
	Allow []Rule `json:"allow,omitempty"`
	Deny  []Rule `json:"deny,omitempty"`
}

// Rule names a destination: an exact host ("api.github.com"), a wildcard
// ("*.pythonhosted.org": any subdomain, not the apex) or a CIDR
// ("203.0.113.0/24", or a single address). CIDR rules match IP literals only
// in Allow, and both literals and resolved addresses in Deny.
//
// Ports empty means 80 and 443 in Allow, and every port in Deny.
type Rule struct {
	Host  string `json:"host"`
	Ports []int  `json:"ports,omitempty"`
}

func (r Rule) String() string {
	if len(r.Ports) == 0 {
		return r.Host
	}
	ps := make([]string, len(r.Ports))
	for i, p := range r.Ports {
		ps[i] = strconv.Itoa(p)
	}
	h := r.Host
	if strings.Contains(h, ":") {
		h = "[" + h + "]"
	}
	return h + ":" + strings.Join(ps, ",")
}

// ParsePolicy builds a policy from comma-separated lists such as
// "api.github.com,*.pythonhosted.org:443,pypi.org". Each entry is a host,
// wildcard or CIDR with an optional ":port" (IPv6 with a port is bracketed:
// "[2001:db8::/32]:443"). An allow list of "*" means ModePublic; an empty
// allow list means ModeDeny. Errors are errdefs.ErrInvalidArgument.
func ParsePolicy(allow, deny string) (Policy, error) {
	var p Policy
	allow = strings.TrimSpace(allow)
	switch allow {
	case "":
		p.Mode = ModeDeny
	case "*":
		p.Mode = ModePublic
	default:
		p.Mode = ModeAllowlist
		rs, err := parseRules(allow)
		if err != nil {
			return Policy{}, fmt.Errorf("allow: %w", err)
		}
		p.Allow = rs
	}
	if strings.TrimSpace(deny) != "" {
		rs, err := parseRules(deny)
		if err != nil {
			return Policy{}, fmt.Errorf("deny: %w", err)
		}
		p.Deny = rs
	}
	if _, err := compilePolicy(p); err != nil {
		return Policy{}, err
	}
	return p, nil
}

func parseRules(list string) ([]Rule, error) {
	var out []Rule
	for _, e := range strings.Split(list, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		r, err := parseRule(e)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

func parseRule(e string) (Rule, error) {
	host, port := e, ""
	switch {
	case strings.HasPrefix(e, "["):
		end := strings.Index(e, "]")
		if end < 0 {
			return Rule{}, errdefs.InvalidArgument("egress rule %q: missing ']'", e)
		}
		host, port = e[1:end], e[end+1:]
		if port != "" {
			if !strings.HasPrefix(port, ":") {
				return Rule{}, errdefs.InvalidArgument("egress rule %q: expected ':port' after ']'", e)
			}
			port = port[1:]
		}
	case strings.Count(e, ":") == 1:
		i := strings.LastIndex(e, ":")
		host, port = e[:i], e[i+1:]
	}
	r := Rule{Host: host}
	if port != "" {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 {
			return Rule{}, errdefs.InvalidArgument("egress rule %q: port must be 1-65535", e)
		}
		r.Ports = []int{n}
	}
	return r, nil
}

// Validate reports whether p is well formed (errdefs.ErrInvalidArgument).
func (p Policy) Validate() error {
	_, err := compilePolicy(p)
	return err
}

// compiled forms, built once per SetPolicy.
type compiledPolicy struct {
	mode  string
	allow []*rule
	deny  []*rule
}

type rule struct {
	src    Rule
	exact  string       // lower-case name
	suffix string       // ".example.com" for "*.example.com"
	prefix netip.Prefix // CIDR rules
	ports  []int        // nil: any port
}

func (r *rule) isCIDR() bool { return r.prefix.IsValid() }

func (r *rule) matchName(host string) bool {
	switch {
	case r.exact != "":
		return host == r.exact
	case r.suffix != "":
		return len(host) > len(r.suffix) && strings.HasSuffix(host, r.suffix)
	}
	return false
}

func (r *rule) matchAddr(a netip.Addr) bool {
	return r.isCIDR() && r.prefix.Contains(a.Unmap())
}

func (r *rule) matchPort(port int) bool { return r.ports == nil || slices.Contains(r.ports, port) }

func compilePolicy(p Policy) (*compiledPolicy, error) {
	c := &compiledPolicy{mode: p.Mode}
	switch p.Mode {
	case "":
		c.mode = ModeDeny
	case ModeDeny, ModeAllowlist, ModePublic:
	default:
		return nil, errdefs.InvalidArgument("egress policy: mode %q is not one of deny, allowlist, public", p.Mode)
	}
	for _, r := range p.Allow {
		cr, err := compileRule(r, []int{80, 443})
		if err != nil {
			return nil, err
		}
		c.allow = append(c.allow, cr)
	}
	for _, r := range p.Deny {
		cr, err := compileRule(r, nil)
		if err != nil {
			return nil, err
		}
		c.deny = append(c.deny, cr)
	}
	return c, nil
}

func compileRule(r Rule, defaultPorts []int) (*rule, error) {
	h := strings.ToLower(strings.TrimSpace(r.Host))
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	if h == "" {
		return nil, errdefs.InvalidArgument("egress rule: empty host")
	}
	cr := &rule{src: r, ports: defaultPorts}
	if len(r.Ports) > 0 {
		cr.ports = nil
		for _, p := range r.Ports {
			if p < 1 || p > 65535 {
				return nil, errdefs.InvalidArgument("egress rule %q: port %d is not 1-65535", r.Host, p)
			}
			cr.ports = append(cr.ports, p)
		}
	}
	switch {
	case strings.Contains(h, "/"):
		pf, err := netip.ParsePrefix(h)
		if err != nil {
			return nil, errdefs.InvalidArgument("egress rule %q: not a CIDR (want e.g. 203.0.113.0/24)", r.Host)
		}
		cr.prefix = netip.PrefixFrom(pf.Addr().Unmap(), pf.Bits()-unmapBits(pf.Addr())).Masked()
	case strings.HasPrefix(h, "*."):
		rest := h[2:]
		if strings.Contains(rest, "*") {
			return nil, errdefs.InvalidArgument("egress rule %q: '*' is allowed only as the first label", r.Host)
		}
		rest = strings.TrimSuffix(rest, ".")
		if err := validHostname(rest); err != nil {
			return nil, errdefs.InvalidArgument("egress rule %q: %v", r.Host, err)
		}
		cr.suffix = "." + rest
	case h == "*":
		return nil, errdefs.InvalidArgument("egress rule \"*\" (every public destination) must be the allow list's only entry")
	case strings.Contains(h, "*"):
		return nil, errdefs.InvalidArgument("egress rule %q: '*' is allowed only as '*.domain'", r.Host)
	default:
		if a, err := netip.ParseAddr(h); err == nil {
			a = a.Unmap()
			cr.prefix = netip.PrefixFrom(a, a.BitLen())
			break
		}
		if _, lit := parseIPLiteral(h); lit {
			return nil, errdefs.InvalidArgument("egress rule %q: write addresses as dotted quads or CIDRs", r.Host)
		}
		h = strings.TrimSuffix(h, ".")
		if err := validHostname(h); err != nil {
			return nil, errdefs.InvalidArgument("egress rule %q: %v", r.Host, err)
		}
		cr.exact = h
	}
	return cr, nil
}

// unmapBits is how many prefix bits the ::ffff:0:0/96 mapping adds.
func unmapBits(a netip.Addr) int {
	if a.Is4In6() {
		return 96
	}
	return 0
}

// hostPatterns compiles secret host patterns (exact names and wildcards).
func hostPatterns(hosts []string) ([]*rule, error) {
	if len(hosts) == 0 {
		return nil, errdefs.InvalidArgument("secret: at least one host is required")
	}
	var out []*rule
	for _, h := range hosts {
		// "host" or "host:port": a secret goes only to the ports it is
		// bound to, 443 when the binding names none.
		pr, err := parseRule(h)
		if err != nil {
			return nil, err
		}
		r, err := compileRule(pr, []int{443})
		if err != nil {
			return nil, err
		}
		if r.isCIDR() {
			return nil, errdefs.InvalidArgument("secret host %q: secrets are bound to names, not addresses", h)
		}
		if r.suffix != "" {
			// "*.com", "*.co.uk" or "*.github.io" would hand the secret to
			// any name anyone can register under that suffix.
			rest := strings.TrimPrefix(r.suffix, ".")
			if ps, _ := publicsuffix.PublicSuffix(rest); ps == rest {
				return nil, errdefs.InvalidArgument("secret host %q: %s is a public suffix (anyone can register names under it); name the domain, e.g. *.example.%s", h, rest, rest)
			}
		}
		out = append(out, r)
	}
	return out, nil
}
