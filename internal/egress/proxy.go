package egress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"crypto/x509"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spacesandbox/space/internal/errdefs"
)

// Resolver resolves allowed names on the host.
type Resolver interface {
	LookupIP(ctx context.Context, host string) ([]net.IP, error)
}

// Dialer opens upstream connections (to vetted "ip:port" addresses only).
type Dialer interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

type systemResolver struct{}

func (systemResolver) LookupIP(ctx context.Context, host string) ([]net.IP, error) {
	return net.DefaultResolver.LookupIP(ctx, "ip", host)
}

// Config configures a Proxy. The zero value is strict: system DNS, no hosts
// overrides, no private ranges, system roots for upstream TLS, in-memory CAs.
type Config struct {
	// Resolver resolves allowed names (default: the system resolver).
	Resolver Resolver
	// Hosts is an operator's hosts-style map consulted before Resolver.
	// Off by default; tests use it to name loopback servers. Hosts entries
	// are still vetted: a private address needs AllowCIDRs too.
	Hosts map[string][]net.IP
	// AllowCIDRs exempts operator-chosen ranges from the private-address
	// refusal (for example an internal package mirror). Off by default.
	AllowCIDRs []netip.Prefix
	// Dialer dials vetted upstream addresses (default: net.Dialer).
	Dialer Dialer
	// Audit receives a record per attempt (default: NewRing(1000)).
	Audit AuditSink
	// CAs holds per-sandbox interception CAs (default: in memory only).
	CAs *CAStore
	// RootCAs verifies upstream certificates of intercepted connections
	// (nil: the system roots).
	RootCAs *x509.CertPool
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Logger receives decisions; never secret values (default: discard).
	Logger *slog.Logger
	// IdleTimeout bounds waiting for a request or a tunnel's first bytes
	// (default 2m).
	IdleTimeout time.Duration
	// SniffTimeout is how long a tunnel to a port other than 80 and 443
	// waits for the client's first byte alone; after it the upstream may
	// speak first (server-speaks-first protocols), which makes the tunnel
	// raw TCP (default 1s).
	SniffTimeout time.Duration
	// DialTimeout bounds each upstream dial (default 10s).
	DialTimeout time.Duration
	// ResolveTimeout bounds each lookup (default 5s).
	ResolveTimeout time.Duration
	// MaxConns bounds one sandbox's open connections to the proxy
	// (default 256): each holds host sockets and goroutines, which a
	// sandbox's own limits do not count.
	MaxConns int
}

// AuditReader is implemented by sinks that can answer queries (Ring).
type AuditReader interface {
	Records(sandboxID string, limit int) []Record
	// Forget drops a sandbox's records.
	Forget(sandboxID string)
}

// Proxy is the host side of sandbox egress. Safe for concurrent use.
type Proxy struct {
	cfg     Config
	hosts   map[string][]net.IP
	log     *slog.Logger
	metrics *metrics

	mu    sync.RWMutex
	sbs   map[string]*sandboxState
	conns map[string]map[net.Conn]*tracked
	// revoked holds, per sandbox, the secrets a request of its own
	// carried the value of (guess.go).
	revoked map[string]map[string]bool
}

// tracked is one open client connection of a sandbox.
type tracked struct {
	cancel context.CancelFunc // ends the connection and its upstreams
	// dest is where its upstream goes (nil until one is dialed): a policy
	// change closes the connection when the new policy refuses it.
	dest atomic.Pointer[dest]
	cut  atomic.Bool // closed by a policy change
}

// dest is an upstream a connection was let through to.
type dest struct {
	host string // normalized name or IP literal, as decided
	port int
	addr netip.Addr // the address dialed
}

// sandboxState is replaced wholesale, never mutated, so readers can hold it
// without the lock.
type sandboxState struct {
	policy  *compiledPolicy
	secrets []*boundSecret
}

type boundSecret struct {
	placeholder string
	secret      Secret
	hosts       []*rule
}

// matchHost reports whether the secret is injected on requests to h:port.
func (b *boundSecret) matchHost(h string, port int) bool {
	return slices.ContainsFunc(b.hosts, func(r *rule) bool { return r.matchName(h) && r.matchPort(port) })
}

// matchName reports whether h is one of the secret's hosts, on any port
// (responses from it are scrubbed).
func (b *boundSecret) matchName(h string) bool {
	return slices.ContainsFunc(b.hosts, func(r *rule) bool { return r.matchName(h) })
}

var denyAll = &compiledPolicy{mode: ModeDeny}

// New returns a proxy (errdefs.ErrInvalidArgument for a bad config).
func New(cfg Config) (*Proxy, error) {
	if cfg.Resolver == nil {
		cfg.Resolver = systemResolver{}
	}
	if cfg.Dialer == nil {
		cfg.Dialer = &net.Dialer{KeepAlive: 30 * time.Second}
	}
	if cfg.Audit == nil {
		cfg.Audit = NewRing(1000)
	}
	if cfg.CAs == nil {
		cfg.CAs, _ = NewCAStore("")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = 256
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 2 * time.Minute
	}
	if cfg.SniffTimeout <= 0 {
		cfg.SniffTimeout = time.Second
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.ResolveTimeout <= 0 {
		cfg.ResolveTimeout = 5 * time.Second
	}
	for _, p := range cfg.AllowCIDRs {
		if !p.IsValid() {
			return nil, errdefs.InvalidArgument("egress: AllowCIDRs holds an invalid prefix")
		}
	}
	hosts := map[string][]net.IP{}
	for h, ips := range cfg.Hosts {
		hosts[normalizeHost(h)] = ips
	}
	return &Proxy{
		cfg:     cfg,
		hosts:   hosts,
		log:     cfg.Logger,
		metrics: newMetrics(),
		sbs:     map[string]*sandboxState{},
		conns:   map[string]map[net.Conn]*tracked{},
		revoked: map[string]map[string]bool{},
	}, nil
}

// SetPolicy sets a sandbox's policy. It applies to new connections and
// requests, and to those already open: a connection whose upstream the new
// policy refuses (a tunnel, a plain-HTTP connection, an upgraded one) is
// closed, so taking a host off the list takes it away now.
// Errors: errdefs.ErrInvalidArgument.
func (p *Proxy) SetPolicy(sandboxID string, pol Policy) error {
	c, err := compilePolicy(pol)
	if err != nil {
		return err
	}
	p.mu.Lock()
	old := p.sbs[sandboxID]
	st := &sandboxState{policy: c}
	if old != nil {
		st.secrets = old.secrets
	}
	p.sbs[sandboxID] = st
	var cut []*tracked
	for _, t := range p.conns[sandboxID] {
		// A session publishes its dest before it checks the policy again
		// (see session.admitted); this stores the policy before reading
		// dests, so one of the two sees the other.
		if d := t.dest.Load(); d != nil && !p.permits(c, d) {
			cut = append(cut, t)
		}
	}
	p.mu.Unlock()
	for _, t := range cut {
		d := t.dest.Load()
		p.log.Info("egress connection closed: the new policy refuses it", "sandbox", sandboxID,
			"host", d.host, "port", d.port, "ip", d.addr.String())
		t.cut.Store(true)
		t.cancel()
	}
	return nil
}

// BindSecrets replaces the sandbox's secrets, keyed by placeholder (nil
// unbinds all). Errors: errdefs.ErrInvalidArgument.
func (p *Proxy) BindSecrets(sandboxID string, secrets map[string]Secret) error {
	var bound []*boundSecret
	names := make([]string, 0, len(secrets))
	for ph, s := range secrets {
		if !placeholderRE.MatchString(ph) {
			return errdefs.InvalidArgument("secret %s: placeholder is not one minted by NewPlaceholder", s.Name)
		}
		if err := s.validate(); err != nil {
			return err
		}
		hs, err := hostPatterns(s.Hosts)
		if err != nil {
			return err
		}
		bound = append(bound, &boundSecret{placeholder: ph, secret: s, hosts: hs})
		names = append(names, s.Name)
	}
	slices.SortFunc(bound, func(a, b *boundSecret) int { return strings.Compare(a.placeholder, b.placeholder) })
	p.mu.Lock()
	old := p.sbs[sandboxID]
	st := &sandboxState{policy: denyAll, secrets: bound}
	if old != nil {
		st.policy = old.policy
	}
	p.sbs[sandboxID] = st
	p.mu.Unlock()
	slices.Sort(names)
	p.log.Info("egress secrets bound", "sandbox", sandboxID, "secrets", names)
	return nil
}

// RemoveSandbox forgets a sandbox's policy and secrets and closes its open
// connections. Its CA stays in the CAStore (see CAStore.Delete).
func (p *Proxy) RemoveSandbox(sandboxID string) {
	p.mu.Lock()
	delete(p.sbs, sandboxID)
	delete(p.revoked, sandboxID)
	conns := p.conns[sandboxID]
	delete(p.conns, sandboxID)
	p.mu.Unlock()
	for c, t := range conns {
		t.cancel() // its upstreams go too, even silent ones
		c.Close()
	}
}

// CAFor returns the PEM certificate of the sandbox's interception CA, to be
// installed in its trust store.
func (p *Proxy) CAFor(sandboxID string) ([]byte, error) {
	ca, err := p.cfg.CAs.Get(sandboxID)
	if err != nil {
		return nil, err
	}
	return ca.CertPEM(), nil
}

// DropCA removes a destroyed sandbox's interception CA (from memory and,
// with a directory, its file): a new sandbox, a fork's child or one made
// from its checkpoint, gets a CA of its own. Kept, every sandbox ever
// created held a CA and its leaf cache in the server for good.
func (p *Proxy) DropCA(sandboxID string) error {
	return p.cfg.CAs.Delete(sandboxID)
}

// ForgetRecords drops a sandbox's audit records from a queryable sink
// (when its record is forgotten: they are read until then).
func (p *Proxy) ForgetRecords(sandboxID string) {
	if r, ok := p.cfg.Audit.(AuditReader); ok {
		r.Forget(sandboxID)
	}
}

// Records returns the sandbox's newest audit records when the sink can be
// queried (Ring), else nil.
func (p *Proxy) Records(sandboxID string, limit int) []Record {
	if r, ok := p.cfg.Audit.(AuditReader); ok {
		return r.Records(sandboxID, limit)
	}
	return nil
}

// Collectors returns the proxy's Prometheus counters for registration.
func (p *Proxy) Collectors() []prometheus.Collector {
	return []prometheus.Collector{p.metrics.attempts, p.metrics.bytes}
}

func (p *Proxy) view(sandboxID string) *sandboxState {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if st := p.sbs[sandboxID]; st != nil {
		return st
	}
	return &sandboxState{policy: denyAll}
}

// track registers a connection of sandbox id and the cancel of its
// context; nil when the sandbox has MaxConns open already.
func (p *Proxy) track(id string, c net.Conn, cancel context.CancelFunc) *tracked {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.conns[id]
	if m == nil {
		m = map[net.Conn]*tracked{}
		p.conns[id] = m
	}
	if len(m) >= p.cfg.MaxConns {
		return nil
	}
	t := &tracked{cancel: cancel}
	m[c] = t
	return t
}

func (p *Proxy) untrack(id string, c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if m := p.conns[id]; m != nil {
		delete(m, c)
		if len(m) == 0 {
			delete(p.conns, id)
		}
	}
}

// blocked names the refused range of a, honouring Config.AllowCIDRs.
func (p *Proxy) blocked(a netip.Addr) string {
	a = a.Unmap()
	for _, pf := range p.cfg.AllowCIDRs {
		if pf.Contains(a) {
			return ""
		}
	}
	return blockedRange(a)
}

func (p *Proxy) lookup(ctx context.Context, host string) ([]net.IP, error) {
	if ips, ok := p.hosts[host]; ok {
		return ips, nil
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.ResolveTimeout)
	defer cancel()
	return p.cfg.Resolver.LookupIP(ctx, host)
}

// decision is the verdict on one destination.
type decision struct {
	allow  bool
	reason string
	rule   string
	addrs  []netip.Addr // vetted, in dial order
}

func deny(reason, rule string) decision { return decision{reason: reason, rule: rule} }

// portMiss explains a refusal where an allow rule names the host but not
// the port ("" when none does): the rule's ports are what to change.
func portMiss(rules []*rule, match func(*rule) bool, port int) string {
	for _, r := range rules {
		if match(r) {
			ps := make([]string, len(r.ports))
			for i, p := range r.ports {
				ps[i] = strconv.Itoa(p)
			}
			return fmt.Sprintf("port %d is not allowed: rule %s allows ports %s", port, r.src.Host, strings.Join(ps, ","))
		}
	}
	return ""
}

// decide applies the policy to host:port. It resolves only names the
// policy allows, and returns only addresses that passed vetting.
func (p *Proxy) decide(ctx context.Context, sandboxID, host string, port int) decision {
	pol := p.view(sandboxID).policy
	if strings.Contains(strings.ToLower(host), PlaceholderPrefix) {
		return deny(ReasonLeak, "secret placeholder in the host name")
	}
	if port < 1 || port > 65535 {
		return deny(ReasonProtocol, "invalid port")
	}
	h := normalizeHost(host)
	if a, lit := parseIPLiteral(h); lit {
		if !a.IsValid() {
			return deny(ReasonIPLiteral, "malformed IP literal")
		}
		return p.admitLiteral(pol, a.Unmap(), port)
	}
	if validHostname(h) != nil {
		return deny(ReasonInvalidHost, "not a host name")
	}
	d := admitName(pol, h, port)
	if !d.allow {
		return d
	}
	ips, err := p.lookup(ctx, h)
	if err != nil || len(ips) == 0 {
		return deny(ReasonResolve, "name does not resolve")
	}
	var refused decision
	for _, ip := range ips {
		a, ok := netip.AddrFromSlice(ip)
		if !ok {
			continue
		}
		a = a.Unmap()
		if r := p.vetAddr(pol, a, port); r.reason != "" {
			if refused.reason == "" || r.reason == ReasonDenyRule {
				refused = r
			}
			continue
		}
		d.addrs = append(d.addrs, a)
	}
	if len(d.addrs) == 0 {
		if refused.reason == "" {
			refused = deny(ReasonResolve, "name does not resolve")
		}
		return refused
	}
	return d
}

// admitLiteral applies pol to an IP literal destination (a unmapped).
func (p *Proxy) admitLiteral(pol *compiledPolicy, a netip.Addr, port int) decision {
	for _, r := range pol.deny {
		if r.matchAddr(a) && r.matchPort(port) {
			return deny(ReasonDenyRule, "deny "+r.src.String())
		}
	}
	var allowed *rule
	for _, r := range pol.allow {
		if r.matchAddr(a) && r.matchPort(port) {
			allowed = r
			break
		}
	}
	if allowed == nil || pol.mode == ModeDeny {
		if msg := portMiss(pol.allow, func(r *rule) bool { return r.matchAddr(a) }, port); msg != "" && pol.mode != ModeDeny {
			return deny(ReasonNotAllowed, msg)
		}
		return deny(ReasonIPLiteral, "IP literal without an allowing CIDR rule")
	}
	if n := p.blocked(a); n != "" {
		return deny(ReasonPrivate, n+" address")
	}
	return decision{allow: true, rule: "allow " + allowed.src.String(), addrs: []netip.Addr{a}}
}

// admitName applies pol's name rules to a normalized host name, before
// any lookup: an allowing decision carries the rule, no addresses.
func admitName(pol *compiledPolicy, h string, port int) decision {
	for _, r := range pol.deny {
		if r.matchName(h) && r.matchPort(port) {
			return deny(ReasonDenyRule, "deny "+r.src.String())
		}
	}
	switch pol.mode {
	case ModePublic:
		return decision{allow: true, rule: "public"}
	case ModeAllowlist:
		for _, r := range pol.allow {
			if r.matchName(h) && r.matchPort(port) {
				return decision{allow: true, rule: "allow " + r.src.String()}
			}
		}
	}
	if pol.mode == ModeDeny {
		return deny(ReasonNotAllowed, "egress is disabled (default deny)")
	}
	if msg := portMiss(pol.allow, func(r *rule) bool { return r.matchName(h) }, port); msg != "" && pol.mode == ModeAllowlist {
		return deny(ReasonNotAllowed, msg)
	}
	return deny(ReasonNotAllowed, "not in the allow list")
}

// vetAddr refuses an address a name resolved to when a deny rule covers
// it or it is in a blocked range (the zero decision when it passes).
func (p *Proxy) vetAddr(pol *compiledPolicy, a netip.Addr, port int) decision {
	if i := slices.IndexFunc(pol.deny, func(r *rule) bool { return r.matchAddr(a) && r.matchPort(port) }); i >= 0 {
		return deny(ReasonDenyRule, "deny "+pol.deny[i].src.String())
	}
	if n := p.blocked(a); n != "" {
		return deny(ReasonPrivate, "resolves to a "+n+" address")
	}
	return decision{}
}

// permits reports whether pol still lets a connection already open to
// host:port at address a go on (no lookup: the address is the one dialed).
func (p *Proxy) permits(pol *compiledPolicy, dst *dest) bool {
	if _, lit := parseIPLiteral(dst.host); lit {
		return p.admitLiteral(pol, dst.addr, dst.port).allow
	}
	return admitName(pol, dst.host, dst.port).allow && p.vetAddr(pol, dst.addr, dst.port).reason == ""
}

// ServeConn serves one connection tunnelled from sandboxID's proxy
// endpoint until the client or ctx ends it. It closes c.
func (p *Proxy) ServeConn(ctx context.Context, sandboxID string, c net.Conn) {
	defer c.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s := &session{p: p, sb: sandboxID, c: c, br: bufio.NewReaderSize(c, 32<<10), log: p.log.With("sandbox", sandboxID)}
	if s.t = p.track(sandboxID, c, cancel); s.t == nil {
		s.respond(c, http.StatusServiceUnavailable, ReasonConnLimit, fmt.Sprintf("space egress: %d connections open from this sandbox, the most at once", p.cfg.MaxConns))
		return
	}
	defer p.untrack(sandboxID, c)
	// The connection's end (its client's, the sandbox's removal, ctx)
	// closes every upstream it opened: a silent upstream held a socket
	// and two goroutines for good, past the sandbox's end.
	stop := context.AfterFunc(ctx, func() { c.Close(); s.closeAllUpstreams() })
	defer stop()
	defer s.closeUpstream()
	for {
		_ = c.SetReadDeadline(time.Now().Add(p.cfg.IdleTimeout))
		head, err := peekHead(s.br)
		if err != nil {
			if errors.Is(err, errHeadTooLarge) {
				s.respond(c, http.StatusRequestHeaderFieldsTooLarge, ReasonProtocol, "space egress: request header too large")
			}
			return
		}
		_ = c.SetReadDeadline(time.Time{})
		hostHdr := headerValue(head, "host")
		req, err := http.ReadRequest(s.br)
		if err != nil {
			s.respond(c, http.StatusBadRequest, ReasonProtocol, "space egress: malformed request")
			return
		}
		if req.Method == http.MethodConnect {
			s.connect(ctx, req)
			return
		}
		if !s.plain(ctx, req, hostHdr) {
			return
		}
	}
}

// session is one client connection.
type session struct {
	p   *Proxy
	sb  string
	t   *tracked
	c   net.Conn
	br  *bufio.Reader
	log *slog.Logger

	// plain HTTP: the upstream of the previous request, reused when the
	// next one goes to the same host:port.
	up    *countConn
	upbr  *bufio.Reader
	upKey string
	upIP  netip.Addr

	audited *Record // the last record audited

	upsMu sync.Mutex
	ups   []net.Conn // every upstream opened, for closeAllUpstreams
}

// admitted publishes the session's upstream for policy changes to see, then
// checks it against the policy in force now: false when a change made
// since the decision refuses it (SetPolicy may have looked before this
// store; this check covers that order).
func (s *session) admitted(host string, port int, a netip.Addr) bool {
	d := &dest{host: host, port: port, addr: a}
	s.t.dest.Store(d)
	return s.p.permits(s.p.view(s.sb).policy, d)
}

func (s *session) closeUpstream() {
	if s.up != nil {
		s.up.Close()
		s.up, s.upbr, s.upKey = nil, nil, ""
	}
}

// opened registers an upstream of the session, closed with it.
func (s *session) opened(c net.Conn) {
	s.upsMu.Lock()
	s.ups = append(s.ups, c)
	s.upsMu.Unlock()
}

// closeAllUpstreams closes every upstream the session opened (from any
// goroutine: it reads no field the session's own goroutine writes).
func (s *session) closeAllUpstreams() {
	s.upsMu.Lock()
	ups := s.ups
	s.ups = nil
	s.upsMu.Unlock()
	for _, u := range ups {
		u.Close()
	}
}

// audit records rec once (refusals audit before answering, so a client
// that sees a refusal finds it in the audit log).
func (s *session) audit(rec *Record) {
	if rec == s.audited {
		return
	}
	s.audited = rec
	if rec.Duration == 0 {
		rec.Duration = s.p.cfg.Now().Sub(rec.Time)
	}
	if rec.Decision == "" {
		rec.Decision = DecisionAllow
		if s.t != nil && s.t.cut.Load() && rec.Reason == "" {
			rec.Reason = ReasonPolicyChanged // let through, then closed by a change
		}
	}
	s.p.cfg.Audit.Audit(*rec)
	s.p.metrics.observe(*rec)
	attrs := []any{"host", rec.Host, "port", rec.Port, "ip", rec.IP, "method", rec.Method, "decision", rec.Decision,
		"reason", rec.Reason, "rule", rec.Rule, "secret", rec.Secret, "up", rec.BytesUp, "down", rec.BytesDown}
	if rec.Decision == DecisionDeny {
		s.log.Info("egress refused", attrs...)
	} else {
		s.log.Debug("egress", attrs...)
	}
}

// refuse marks rec refused and answers the client with a short reason.
func (s *session) refuse(w io.Writer, rec *Record, status int, reason, rule string) {
	rec.Decision, rec.Reason, rec.Rule = DecisionDeny, reason, rule
	s.audit(rec)
	s.respond(w, status, reason, fmt.Sprintf("space egress: %s refused: %s",
		safe(net.JoinHostPort(rec.Host, strconv.Itoa(rec.Port))), rule))
}

func (s *session) respond(w io.Writer, status int, reason, msg string) {
	body := msg + "\n"
	fmt.Fprintf(w, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\nX-Space-Egress: %s\r\n\r\n%s",
		status, http.StatusText(status), len(body), reason, body)
}

// safe makes client-supplied text fit for a response line.
func safe(s string) string {
	if len(s) > 200 {
		s = s[:200]
	}
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return '?'
		}
		return r
	}, s)
}

func (s *session) dial(ctx context.Context, addrs []netip.Addr, port int) (*countConn, netip.Addr, error) {
	var last error
	for i, a := range addrs {
		if i == 3 {
			break
		}
		dctx, cancel := context.WithTimeout(ctx, s.p.cfg.DialTimeout)
		c, err := s.p.cfg.Dialer.DialContext(dctx, "tcp", netip.AddrPortFrom(a, uint16(port)).String())
		cancel()
		if err == nil {
			s.opened(c)
			return &countConn{Conn: c}, a, nil
		}
		last = err
	}
	return nil, netip.Addr{}, last
}

// plain serves one absolute-URI HTTP request; false ends the connection.
func (s *session) plain(ctx context.Context, req *http.Request, hostHdr string) bool {
	rec := &Record{Time: s.p.cfg.Now(), SandboxID: s.sb, Method: req.Method}
	defer s.audit(rec)
	u := req.URL
	rec.Host = normalizeHost(u.Hostname())
	rec.Port = 80
	if u.Scheme != "http" || u.Host == "" {
		rec.Host = safe(u.Host)
		s.refuse(s.c, rec, http.StatusBadRequest, ReasonProtocol, "only absolute http:// URIs and CONNECT are proxied")
		return false
	}
	if ps := u.Port(); ps != "" {
		n, err := strconv.Atoi(ps)
		if err != nil {
			s.refuse(s.c, rec, http.StatusBadRequest, ReasonProtocol, "invalid port")
			return false
		}
		rec.Port = n
	}
	if names := placeholdersIn(req, s.p.view(s.sb).secrets); names != nil {
		rec.Secret = strings.Join(names, ",")
		s.refuse(s.c, rec, http.StatusForbidden, ReasonLeak, "secret placeholders are never sent over plain HTTP")
		return false
	}
	if !hostMatches(hostHdr, rec.Host, rec.Port) {
		s.refuse(s.c, rec, http.StatusForbidden, ReasonHostMismatch, fmt.Sprintf("Host header %q does not match the request", safe(hostHdr)))
		return false
	}
	d := s.p.decide(ctx, s.sb, u.Hostname(), rec.Port)
	rec.Rule = d.rule
	if !d.allow {
		s.refuse(s.c, rec, http.StatusForbidden, d.reason, d.rule)
		return false
	}
	key := net.JoinHostPort(rec.Host, strconv.Itoa(rec.Port))
	if s.up == nil || s.upKey != key || !slices.Contains(d.addrs, s.upIP) {
		s.closeUpstream()
		up, ip, err := s.dial(ctx, d.addrs, rec.Port)
		if err != nil {
			rec.Reason = ReasonDial
			s.audit(rec)
			s.respond(s.c, http.StatusBadGateway, ReasonDial, "space egress: "+key+" unreachable")
			return false
		}
		s.up, s.upbr, s.upKey, s.upIP = up, bufio.NewReader(up), key, ip
	}
	rec.IP = s.upIP.String()
	if !s.admitted(rec.Host, rec.Port, s.upIP) {
		s.closeUpstream()
		s.refuse(s.c, rec, http.StatusForbidden, ReasonPolicyChanged, "the sandbox's policy changed while connecting")
		return false
	}
	req.Host = u.Host
	u0, d0 := s.up.up.Load(), s.up.down.Load()
	closeAfter, ws, err := roundTrip(req, s.c, s.up, s.upbr, nil) // plain HTTP: secrets go only over TLS
	rec.BytesUp, rec.BytesDown = s.up.up.Load()-u0, s.up.down.Load()-d0
	if errors.Is(err, errUpgrade) {
		s.closeUpstream()
		s.refuse(s.c, rec, http.StatusBadGateway, ReasonProtocol, "only WebSocket upgrades are let through")
		return false
	}
	if ws != nil {
		// Pinned to this upstream connection, frames only (wsclient.go).
		pipe(s.c, newWSClientReader(s.br, ws.ext, nil), s.up, s.upbr)
		rec.BytesUp, rec.BytesDown = s.up.up.Load()-u0, s.up.down.Load()-d0
		return false
	}
	if err != nil || closeAfter {
		s.closeUpstream()
		return false
	}
	return true
}

// connect serves a CONNECT tunnel.
func (s *session) connect(ctx context.Context, req *http.Request) {
	rec := &Record{Time: s.p.cfg.Now(), SandboxID: s.sb, Method: http.MethodConnect}
	defer s.audit(rec)
	host, ps, err := net.SplitHostPort(req.RequestURI)
	port, perr := strconv.Atoi(ps)
	if err != nil || perr != nil {
		rec.Host = safe(req.RequestURI)
		s.refuse(s.c, rec, http.StatusBadRequest, ReasonProtocol, "CONNECT needs host:port")
		return
	}
	rec.Host, rec.Port = normalizeHost(host), port
	if names := placeholdersIn(req, s.p.view(s.sb).secrets); names != nil {
		rec.Secret = strings.Join(names, ",")
		s.refuse(s.c, rec, http.StatusForbidden, ReasonLeak, "secret placeholder in the CONNECT request")
		return
	}
	d := s.p.decide(ctx, s.sb, host, port)
	rec.Rule = d.rule
	if !d.allow {
		s.refuse(s.c, rec, http.StatusForbidden, d.reason, d.rule)
		return
	}
	up, ip, err := s.dial(ctx, d.addrs, port)
	if err != nil {
		rec.Reason = ReasonDial
		s.audit(rec)
		s.respond(s.c, http.StatusBadGateway, ReasonDial, "space egress: "+net.JoinHostPort(rec.Host, ps)+" unreachable")
		return
	}
	defer up.Close()
	stop := context.AfterFunc(ctx, func() { up.Close() })
	defer stop()
	rec.IP = ip.String()
	if !s.admitted(rec.Host, port, ip) {
		s.refuse(s.c, rec, http.StatusForbidden, ReasonPolicyChanged, "the sandbox's policy changed while connecting")
		return
	}
	defer func() { rec.BytesUp, rec.BytesDown = up.up.Load(), up.down.Load() }()
	if _, err := io.WriteString(s.c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	kind, upr := s.sniff(port, up)
	switch kind {
	case kindTLS:
		hello, err := peekClientHello(s.br)
		if err != nil {
			rec.Decision, rec.Reason, rec.Rule = DecisionDeny, ReasonProtocol, "unreadable TLS ClientHello"
			s.audit(rec)
			s.c.Write(tlsAlertAccessDenied)
			return
		}
		rec.SNI = safe(hello.ServerName)
		_, literal := parseIPLiteral(rec.Host)
		switch {
		case strings.Contains(strings.ToLower(hello.ServerName), PlaceholderPrefix):
			rec.Decision, rec.Reason, rec.Rule = DecisionDeny, ReasonLeak, "secret placeholder in TLS SNI"
		case hello.ServerName == "" && !literal:
			rec.Decision, rec.Reason, rec.Rule = DecisionDeny, ReasonMissingSNI, "TLS without SNI"
		case normalizeHost(hello.ServerName) != rec.Host && !(literal && hello.ServerName == ""):
			rec.Decision, rec.Reason, rec.Rule = DecisionDeny, ReasonSNIMismatch, "TLS SNI does not match the CONNECT host"
		}
		if rec.Decision == DecisionDeny {
			s.audit(rec)
			s.c.Write(tlsAlertAccessDenied)
			return
		}
		if s.intercepts(rec.Host, port) {
			s.intercept(ctx, rec, up, upr)
			return
		}
		pipe(s.c, s.br, up, upr)
	case kindHTTP:
		s.relay(rec, s.c, s.br, up, upr, up, false)
	case kindRaw:
		if port == 80 || port == 443 {
			rec.Decision, rec.Reason, rec.Rule = DecisionDeny, ReasonProtocol, "only TLS or HTTP on ports 80 and 443"
			return
		}
		pipe(s.c, s.br, up, upr)
	}
}

// intercepts reports whether a TLS tunnel is terminated here: every TLS
// tunnel of a sandbox that holds secrets, whatever the port, so that a
// placeholder sent to a host it is not bound to is seen and refused.
func (s *session) intercepts(host string, port int) bool {
	return len(s.p.view(s.sb).secrets) > 0
}

// tlsAlertAccessDenied is a fatal TLS access_denied alert record.
var tlsAlertAccessDenied = []byte{0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x31}
