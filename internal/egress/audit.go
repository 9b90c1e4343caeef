package egress

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Decisions in audit records.
const (
	DecisionAllow = "allow"
	DecisionDeny  = "deny"
)

// Reasons in audit records (and the metrics' reason label).
const (
	ReasonNotAllowed    = "not_allowed"      // no allow rule (or mode deny)
	ReasonDenyRule      = "deny_rule"        // a deny rule matched
	ReasonIPLiteral     = "ip_literal"       // IP literal without a CIDR rule
	ReasonPrivate       = "private_address"  // resolved/literal address in a refused range
	ReasonInvalidHost   = "invalid_host"     // not a host name
	ReasonResolve       = "resolve_failed"   // the name did not resolve
	ReasonDial          = "dial_failed"      // allowed, but the upstream did not answer
	ReasonUpstreamTLS   = "upstream_tls"     // the upstream certificate did not verify
	ReasonSNIMismatch   = "sni_mismatch"     // TLS SNI differs from the CONNECT host
	ReasonMissingSNI    = "missing_sni"      // TLS without SNI
	ReasonHostMismatch  = "host_mismatch"    // HTTP Host differs from the target
	ReasonNestedConnect = "nested_connect"   // CONNECT inside a tunnel
	ReasonLeak          = "placeholder_leak" // a secret placeholder sent where it may not go
	ReasonProtocol      = "protocol"         // malformed request or wrong protocol for the port
	ReasonEncoded       = "encoded_response" // a secret's host answered in an encoding the proxy cannot scrub
	ReasonPartial       = "partial_response" // a secret's host answered 206 (ranges are not asked of it)
	ReasonSecretValue   = "secret_value"     // the sandbox sent a secret's value itself (a guess): the secret is revoked for it
	ReasonRevoked       = "secret_revoked"   // a request to the hosts of a secret revoked for the sandbox
	ReasonConnLimit     = "connection_limit" // the sandbox has Config.MaxConns connections open
	ReasonPolicyChanged = "policy_changed"   // the sandbox's policy changed and refuses it now (an open connection is closed)
)

// Record is one audited connection attempt or request. It never holds a
// secret value: Secret is the secret's name.
type Record struct {
	Time      time.Time     `json:"time"`
	SandboxID string        `json:"sandbox_id"`
	Host      string        `json:"host"`
	IP        string        `json:"ip,omitempty"`
	Port      int           `json:"port"`
	SNI       string        `json:"sni,omitempty"`
	Method    string        `json:"method,omitempty"`
	Decision  string        `json:"decision"`
	Rule      string        `json:"rule,omitempty"`
	Reason    string        `json:"reason,omitempty"`
	BytesUp   int64         `json:"bytes_up"`
	BytesDown int64         `json:"bytes_down"`
	Secret    string        `json:"secret,omitempty"`
	Duration  time.Duration `json:"duration"`
}

// AuditSink receives every record. Audit must not block for long: it runs
// on the connection's goroutine.
type AuditSink interface {
	Audit(Record)
}

// Ring keeps the last N records of each sandbox in memory.
type Ring struct {
	n  int
	mu sync.Mutex
	m  map[string]*ring
}

type ring struct {
	buf  []Record
	next int
}

var _ AuditSink = (*Ring)(nil)

// NewRing keeps perSandbox records per sandbox (1000 if <= 0).
func NewRing(perSandbox int) *Ring {
	if perSandbox <= 0 {
		perSandbox = 1000
	}
	return &Ring{n: perSandbox, m: map[string]*ring{}}
}

// Audit stores r.
func (r *Ring) Audit(rec Record) {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.m[rec.SandboxID]
	if g == nil {
		g = &ring{buf: make([]Record, 0, min(r.n, 64))}
		r.m[rec.SandboxID] = g
	}
	if len(g.buf) < r.n {
		g.buf = append(g.buf, rec)
		return
	}
	g.buf[g.next] = rec
	g.next = (g.next + 1) % r.n
}

// Records returns up to limit of the sandbox's newest records, oldest
// first (all kept records if limit <= 0).
func (r *Ring) Records(sandboxID string, limit int) []Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.m[sandboxID]
	if g == nil {
		return nil
	}
	all := make([]Record, 0, len(g.buf))
	all = append(all, g.buf[g.next:]...)
	all = append(all, g.buf[:g.next]...)
	if limit > 0 && len(all) > limit {
		all = all[len(all)-limit:]
	}
	return all
}

// Forget drops a sandbox's records.
func (r *Ring) Forget(sandboxID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.m, sandboxID)
}

type metrics struct {
	attempts *prometheus.CounterVec
	bytes    *prometheus.CounterVec
}

func newMetrics() *metrics {
	return &metrics{
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "space_egress_attempts_total",
			Help: "Egress connection attempts and requests by decision and reason.",
		}, []string{"decision", "reason"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "space_egress_bytes_total",
			Help: "Bytes relayed to (up) and from (down) egress destinations.",
		}, []string{"direction"}),
	}
}

func (m *metrics) observe(r Record) {
	m.attempts.WithLabelValues(r.Decision, r.Reason).Inc()
	if r.BytesUp > 0 {
		m.bytes.WithLabelValues("up").Add(float64(r.BytesUp))
	}
	if r.BytesDown > 0 {
		m.bytes.WithLabelValues("down").Add(float64(r.BytesDown))
	}
}
