package space

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// EgressRecord is one connection attempt a sandbox made through the egress
// proxy, allowed or refused.
type EgressRecord struct {
	Time      time.Time `json:"time"`
	SandboxID string    `json:"sandbox_id"`
	Host      string    `json:"host"`
	IP        string    `json:"ip,omitempty"` // the vetted address dialled; empty when never resolved
	Port      int       `json:"port"`
	SNI       string    `json:"sni,omitempty"`
	Method    string    `json:"method,omitempty"`
	Decision  string    `json:"decision"` // "allow" or "deny"
	Rule      string    `json:"rule,omitempty"`
	Reason    string    `json:"reason,omitempty"`
	BytesUp   int64     `json:"bytes_up"`
	BytesDown int64     `json:"bytes_down"`
	Secret    string    `json:"secret,omitempty"` // name of the secret injected or leaked
}

// EgressLog returns a sandbox's recent egress audit records, oldest first
// (limit 0: the server's default).
func (c *Client) EgressLog(ctx context.Context, id string, limit int) ([]EgressRecord, error) {
	q := url.Values{}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var out struct {
		Records []EgressRecord `json:"records"`
	}
	if err := c.do(ctx, request{method: http.MethodGet, path: "/v1/sandboxes/" + seg(id) + "/egress", query: q}, &out); err != nil {
		return nil, err
	}
	return out.Records, nil
}

// SecretInjection says where the proxy puts a secret's value: a header
// (Format such as "Bearer {value}"), the basic-auth password, or a query
// parameter.
type SecretInjection struct {
	Header    string `json:"header,omitempty"`
	Format    string `json:"format,omitempty"`
	BasicAuth *struct {
		User string `json:"user,omitempty"`
	} `json:"basic_auth,omitempty"`
	QueryParam string `json:"query_param,omitempty"`
}

// PutSecretRequest is the body of POST /v1/secrets. The value is stored on
// the server and never returned.
type PutSecretRequest struct {
	Name   string          `json:"name"`
	Value  string          `json:"value"`
	Hosts  []string        `json:"hosts"`
	Inject SecretInjection `json:"inject"`
}

// PutSecret stores (or replaces) a secret of the caller's team.
func (c *Client) PutSecret(ctx context.Context, req PutSecretRequest) error {
	return c.do(ctx, request{method: http.MethodPost, path: "/v1/secrets", json: req}, nil)
}

// Security probe results.
const (
	ProbeBlocked  = "blocked"
	ProbeBypassed = "BYPASSED"
	ProbeError    = "error"
)

// SecurityProbeRequest is the body of POST /v1/security/probe. Zero fields
// take the server's defaults.
type SecurityProbeRequest struct {
	// Allow is the one destination the probe sandbox may reach, host:port
	// (default "allowed.test:443").
	Allow string `json:"allow,omitempty"`
	// SecretHost is the host the probe secret is bound to (default: Allow's
	// host).
	SecretHost string `json:"secret_host,omitempty"`
	// Forbidden is a name the policy does not allow, used as the target of
	// name-based probes (default "other.test").
	Forbidden string `json:"forbidden,omitempty"`
	// Unbound, when set, is a second allowed name (on a canary port) that the
	// secret is not bound to: placeholder probes send to it.
	Unbound string `json:"unbound,omitempty"`
	// Rebind, when set, is an allowed name that resolves to a private
	// address (DNS rebinding).
	Rebind string `json:"rebind,omitempty"`
	// Only restricts the run to these probe ids.
	Only []string `json:"only,omitempty"`
}

// SecurityResult is one probe's outcome.
type SecurityResult struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Technique string `json:"technique"`
	Result    string `json:"result"` // ProbeBlocked, ProbeBypassed or ProbeError
	Detail    string `json:"detail"`
	Millis    int64  `json:"ms"`
}

// SecurityReport is the outcome of one run of the attack suite.
type SecurityReport struct {
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	// Policy is the probe sandbox's allow list.
	Policy []string `json:"policy"`
	// Controls are the positive controls (an allowed request that must
	// work); a failed control means "blocked" may only mean "unreachable".
	Controls []SecurityResult `json:"controls"`
	Results  []SecurityResult `json:"results"`
	Probes   int              `json:"probes"`
	Bypassed int              `json:"bypassed"`
	Errors   int              `json:"errors"`
}

// Table renders the report as an aligned table ending with the line
// "N probes, M bypassed".
func (r *SecurityReport) Table() string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tRESULT\tNAME\tDETAIL")
	for _, res := range r.Results {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", res.ID, res.Result, res.Name, oneLine(res.Detail, 110))
	}
	tw.Flush()
	for _, c := range r.Controls {
		fmt.Fprintf(&b, "control %s: %s (%s)\n", c.ID, c.Result, oneLine(c.Detail, 110))
	}
	if r.Errors > 0 {
		fmt.Fprintf(&b, "%d probes could not decide (error)\n", r.Errors)
	}
	fmt.Fprintf(&b, "%d probes, %d bypassed\n", r.Probes, r.Bypassed)
	return b.String()
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		s = s[:n-1] + "…"
	}
	return s
}

// RunSecurityProbe runs the attack suite on the server (admin only) and
// returns its report. It takes a minute or two.
func (c *Client) RunSecurityProbe(ctx context.Context, req SecurityProbeRequest) (*SecurityReport, error) {
	var r SecurityReport
	if err := c.do(ctx, request{method: http.MethodPost, path: "/v1/security/probe", json: req}, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// SecurityReport returns the last run's report; IsNotFound(err) before any.
func (c *Client) SecurityReport(ctx context.Context) (*SecurityReport, error) {
	var r SecurityReport
	if err := c.do(ctx, request{method: http.MethodGet, path: "/v1/security/report"}, &r); err != nil {
		return nil, err
	}
	return &r, nil
}
