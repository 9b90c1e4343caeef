// Package security is space's shipped attack suite: a list of network and
// isolation bypass techniques (Probes) run from inside a real sandbox whose
// policy allows exactly one destination, and a runner that decides from
// evidence whether each one got through.
//
// A probe "bypasses" only on demonstrable evidence: a host-side canary
// listener (TCP on 127.0.0.1 and 127.0.0.2, UDP on 127.0.0.1, one set per
// probe, with a per-run token the sandbox is never told) received its
// traffic; the token appears in the probe's output; the proxy opened a
// tunnel (it dials before answering 200) or a response came from something
// other than the proxy; the egress audit log shows an attacker name
// resolved; the real secret value or the CA's private key is found inside.
// A probe whose script could not observe its own refusal is an "error",
// never "blocked".
//
// The runner reaches a server only through a small Target (implemented over
// the public API by ClientTarget); Local runs it inside `space serve`
// against the server's own API and keeps the last report.
package security

import (
	"bufio"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	space "github.com/spacesandbox/space/sdk/go"
)

//go:embed helper.py
var helperPy string

// Results of a probe.
const (
	Blocked  = space.ProbeBlocked
	Bypassed = space.ProbeBypassed
	Error    = space.ProbeError
)

// Report and Request are the API's wire types.
type (
	Report  = space.SecurityReport
	Result  = space.SecurityResult
	Request = space.SecurityProbeRequest
)

// SecretName begins the probe secret's name (which is also its
// placeholder's variable): each run stores its own, SecretName_<random>,
// and deletes it when done, so a run neither replaces a secret of the
// team's own nor leaves one behind.
const SecretName = "SPACE_PROBE_TOKEN"

// ProbeDiskMB is the probe sandbox's disk_mb: small, so that the disk-fill
// probe's write past it costs little.
const ProbeDiskMB = 256

// Target is what the runner needs of a server.
type Target interface {
	// PutSecret stores a secret of the caller's team.
	PutSecret(ctx context.Context, req space.PutSecretRequest) error
	// DeleteSecret deletes a secret of the caller's team.
	DeleteSecret(ctx context.Context, name string) error
	// CreateSandbox creates a running sandbox with this allow list and
	// these bound secrets and a disk of ProbeDiskMB, returning its id.
	CreateSandbox(ctx context.Context, allow, secrets []string) (string, error)
	// Exec runs a command to completion.
	Exec(ctx context.Context, id string, req space.ExecRequest) (*space.ExecResult, error)
	// EgressLog returns the sandbox's audit records.
	EgressLog(ctx context.Context, id string) ([]space.EgressRecord, error)
	// Destroy kills the sandbox.
	Destroy(ctx context.Context, id string) error
}

// Options configure one run.
type Options struct {
	Request
	// ExtraAllow is added to the probe sandbox's allow list. Only for
	// positive controls: a deliberately permissive sandbox must make the
	// matching probes report BYPASSED. "*" makes the allow list just "*"
	// (any public name on any port).
	ExtraAllow []string
	// APIPort is the server's port on the host's loopback (host-api probes).
	APIPort int
	// Parallel is how many probes run at once (default 4).
	Parallel int
	Log      *slog.Logger
}

// Evidence is what the runner knows about one probe after it ran.
type Evidence struct {
	Probe          Probe
	Stdout, Stderr string
	ExitCode       int
	ExecErr        error
	Hits           []string // what this probe's host canaries received
	Audit          []space.EgressRecord
	Nonce          string
	Token          string // the canaries' answer, never told to the sandbox
	SecretValue    string
	millis         int64
}

func (o *Options) defaults() {
	if o.Allow == "" {
		o.Allow = "allowed.test:443"
	}
	if o.Forbidden == "" {
		o.Forbidden = "other.test"
	}
	if o.Parallel <= 0 {
		o.Parallel = 4
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// Run runs the suite (or opts.Only) against target and returns the report.
// An error means the run itself could not happen (no sandbox, no secret);
// probe failures are results.
func Run(ctx context.Context, target Target, opts Options) (*Report, error) {
	opts.defaults()
	host, portStr, err := net.SplitHostPort(opts.Allow)
	if err != nil {
		return nil, fmt.Errorf("allow %q: want host:port: %w", opts.Allow, err)
	}
	if _, err := strconv.Atoi(portStr); err != nil {
		return nil, fmt.Errorf("allow %q: bad port", opts.Allow)
	}
	if opts.SecretHost == "" {
		opts.SecretHost = opts.Allow // host:port: a secret goes only to the ports it names
	}
	rep := &Report{Started: time.Now().UTC()}
	nonce, token := randHex(4), "space-canary-"+randHex(12)
	value := "spaceprobe-secret-" + randHex(16)

	var probes []Probe
	for _, p := range Probes() {
		if len(opts.Only) == 0 || slices.Contains(opts.Only, p.ID) {
			probes = append(probes, p)
		}
	}

	// Host-side canaries: one set per probe, so a hit names its probe.
	canaries := map[string]*canary{}
	var all []*canary
	defer func() {
		for _, c := range all {
			c.close()
		}
	}()
	for _, p := range probes {
		c, err := newCanary(token)
		if err != nil {
			return nil, fmt.Errorf("canary: %w", err)
		}
		canaries[p.ID], all = c, append(all, c)
	}
	unbound, err := newCanary(token)
	if err != nil {
		return nil, fmt.Errorf("canary: %w", err)
	}
	all = append(all, unbound)
	// A file on the host the sandbox must never read.
	hostDir, err := os.MkdirTemp("", "space-probe-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(hostDir)
	hostFile := filepath.Join(hostDir, "hostfile-"+nonce)
	if err := os.WriteFile(hostFile, []byte(token+"\n"), 0o644); err != nil {
		return nil, err
	}

	secret := SecretName + "_" + randHex(8)
	defer func() {
		// Also after a failed put (it may have been stored) and when
		// ctx is done: the run's secret must not outlive it.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := target.DeleteSecret(dctx, secret); err != nil && !space.IsNotFound(err) {
			opts.Log.Warn("security probe: delete the probe secret", "secret", secret, "err", err)
		}
	}()
	if err := target.PutSecret(ctx, space.PutSecretRequest{
		Name: secret, Value: value, Hosts: []string{opts.SecretHost},
		Inject: space.SecretInjection{Header: "Authorization", Format: "Bearer {value}"},
	}); err != nil {
		return nil, fmt.Errorf("probe secret: %w", err)
	}
	policy := []string{opts.Allow}
	if opts.Unbound != "" {
		policy = append(policy, net.JoinHostPort(opts.Unbound, strconv.Itoa(unbound.port)))
	}
	if c := canaries["dns-rebinding"]; c != nil && opts.Rebind != "" {
		policy = append(policy, net.JoinHostPort(opts.Rebind, strconv.Itoa(c.port)))
	}
	policy = append(policy, opts.ExtraAllow...)
	if slices.Contains(opts.ExtraAllow, "*") {
		policy = []string{"*"} // "*" is a whole allow list: public mode
	}
	rep.Policy = policy
	id, err := target.CreateSandbox(ctx, policy, []string{secret})
	if err != nil {
		return nil, fmt.Errorf("probe sandbox: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = target.Destroy(dctx, id)
	}()
	opts.Log.Info("security probe", "sandbox", id, "policy", policy, "probes", len(probes))

	baseEnv := map[string]string{
		"ALLOWED_HOST": host, "ALLOWED_PORT": portStr, "FORBIDDEN": opts.Forbidden,
		"API_PORT": strconv.Itoa(opts.APIPort), "NONCE": nonce, "SECRET_ENV": secret,
		"UNBOUND": opts.Unbound, "UNBOUND_PORT": strconv.Itoa(unbound.port), "REBIND": opts.Rebind,
		"HOST_FILE": hostFile,
	}
	rep.Controls = controls(ctx, target, id, baseEnv, opts, unbound, token)

	ev := make([]*Evidence, len(probes))
	sem := make(chan struct{}, opts.Parallel)
	var wg sync.WaitGroup
	run := func(i int) {
		p := probes[i]
		env := maps(baseEnv)
		env["PROBE_ID"] = p.ID
		env["CANARY_PORT"] = strconv.Itoa(canaries[p.ID].port)
		env["CANARY_UDP"] = strconv.Itoa(canaries[p.ID].udpPort)
		start := time.Now()
		runProbe(ctx, target, id, env, ev[i])
		opts.Log.Debug("probe ran", "probe", p.ID, "ms", time.Since(start).Milliseconds())
	}
	for i, p := range probes {
		ev[i] = &Evidence{Probe: p, Nonce: nonce, Token: token, SecretValue: value}
		if p.Alone {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			run(i)
		}()
	}
	wg.Wait()
	for i, p := range probes {
		if p.Alone {
			run(i)
		}
	}
	time.Sleep(300 * time.Millisecond) // let late canary hits land
	audit, auditErr := target.EgressLog(ctx, id)
	for i, e := range ev {
		e.Audit = audit
		e.Hits = canaries[e.Probe.ID].received()
		for _, h := range unbound.received() {
			if strings.Contains(h, "/"+e.Probe.ID) {
				e.Hits = append(e.Hits, "unbound host: "+h)
			}
		}
		res, detail := decide(e)
		rep.Results = append(rep.Results, Result{ID: e.Probe.ID, Name: e.Probe.Name, Technique: e.Probe.Technique,
			Result: res, Detail: detail, Millis: ev[i].millis})
	}
	if len(opts.Only) == 0 || slices.Contains(opts.Only, "audit-consistency") {
		rep.Results = append(rep.Results, auditConsistency(audit, auditErr, policy, opts, value))
	}
	for _, r := range rep.Results {
		rep.Probes++
		switch r.Result {
		case Bypassed:
			rep.Bypassed++
		case Error:
			rep.Errors++
		}
	}
	rep.Finished = time.Now().UTC()
	return rep, nil
}

func maps(m map[string]string) map[string]string {
	out := make(map[string]string, len(m)+4)
	for k, v := range m {
		out[k] = v
	}
	return out
}

// runProbe runs one probe's script in the sandbox and fills in e.
func runProbe(ctx context.Context, target Target, id string, env map[string]string, e *Evidence) {
	req := space.ExecRequest{Env: env, TimeoutS: 60}
	if e.Probe.Root {
		req.User = "root"
	}
	if e.Probe.Python != "" {
		req.Cmd = []string{"python3", "-"}
		req.Stdin = helperPy + "\n# --- probe " + e.Probe.ID + "\n" + e.Probe.Python + "\n"
	} else {
		req.Shell = e.Probe.Shell
	}
	start := time.Now()
	res, err := target.Exec(ctx, id, req)
	e.millis = time.Since(start).Milliseconds()
	if err != nil {
		e.ExecErr = err
		return
	}
	e.Stdout, e.Stderr, e.ExitCode = string(res.Stdout), string(res.Stderr), res.ExitCode
	if res.Error != "" {
		e.ExecErr = errors.New("exec: " + res.Error)
	}
}

// decide turns evidence into a result. Host-side evidence wins over
// anything the script says; a script must observe its refusal to count
// as blocked.
func decide(e *Evidence) (string, string) {
	if len(e.Hits) > 0 {
		return Bypassed, "host canary received: " + e.Hits[0]
	}
	if strings.Contains(e.Stdout+e.Stderr, e.Token) {
		return Bypassed, "the host canary's token appeared in the sandbox: " + lineWith(e.Stdout+e.Stderr, e.Token)
	}
	var bypass, blocked, errs []string
	sc := bufio.NewScanner(strings.NewReader(e.Stdout))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		switch {
		case strings.HasPrefix(l, "BYPASS: "):
			bypass = append(bypass, l[8:])
		case strings.HasPrefix(l, "BLOCKED: "):
			blocked = append(blocked, l[9:])
		case strings.HasPrefix(l, "ERROR: "):
			errs = append(errs, l[7:])
		}
	}
	if len(bypass) > 0 {
		return Bypassed, bypass[0]
	}
	if e.ExecErr != nil {
		return Error, e.ExecErr.Error()
	}
	extra := ""
	if e.Probe.Check != nil {
		res, d := e.Probe.Check(e)
		if res != "" {
			return res, d
		}
		extra = "; " + d
	}
	if len(errs) > 0 {
		return Error, errs[0]
	}
	if len(blocked) == 0 {
		return Error, fmt.Sprintf("no verdict (exit %d): %s", e.ExitCode, tail(e.Stderr+e.Stdout, 200))
	}
	return Blocked, fmt.Sprintf("%d attempts refused; %s%s", len(blocked), blocked[0], extra)
}

func lineWith(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return tail(l, 160)
		}
	}
	return ""
}

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// controls are positive checks that make "blocked" meaningful: the allowed
// destination works through the proxy (with interception), and the unbound
// host is reachable without a placeholder.
func controls(ctx context.Context, t Target, id string, env map[string]string, opts Options, unbound *canary, token string) []Result {
	var out []Result
	res, err := t.Exec(ctx, id, space.ExecRequest{Env: env, TimeoutS: 30, Shell: `curl -sS --max-time 8 -o /dev/null -w '%{http_connect} %{http_code}' -H "Authorization: Bearer $` + env["SECRET_ENV"] + `" "https://$ALLOWED_HOST:$ALLOWED_PORT/space-probe-control" 2>&1`})
	r := Result{ID: "allowed-reachable", Name: "The allowed destination works through the proxy", Technique: "curl https://<allow>/ with the placeholder"}
	switch {
	case err != nil:
		r.Result, r.Detail = Error, err.Error()
	case res.ExitCode == 0 && !strings.HasSuffix(strings.TrimSpace(string(res.Stdout)), "000"):
		r.Result, r.Detail = "ok", "http_connect/http_code "+strings.TrimSpace(string(res.Stdout))
	default:
		r.Result, r.Detail = "failed", fmt.Sprintf("exit %d: %s", res.ExitCode, tail(string(res.Stdout), 160))
	}
	out = append(out, r)
	if opts.Unbound != "" {
		res, err := t.Exec(ctx, id, space.ExecRequest{Env: env, TimeoutS: 30, Shell: `curl -sS --max-time 8 --noproxy '' -x http://127.0.0.1:3128 "http://$UNBOUND:$UNBOUND_PORT/control" 2>&1`})
		r := Result{ID: "unbound-reachable", Name: "The unbound host is reachable without a placeholder", Technique: "curl http://<unbound>:<canary>/control"}
		switch {
		case err != nil:
			r.Result, r.Detail = Error, err.Error()
		case strings.Contains(string(res.Stdout), token):
			r.Result, r.Detail = "ok", "canary answered"
		default:
			r.Result, r.Detail = "failed", tail(string(res.Stdout), 160)
		}
		out = append(out, r)
	}
	return out
}

// auditConsistency checks the whole run's audit log on the host side:
// every allowed connection went to a destination of the policy, and no
// record carries the secret's value.
func auditConsistency(audit []space.EgressRecord, err error, policy []string, opts Options, value string) Result {
	r := Result{ID: "audit-consistency", Name: "Audit log: only policy destinations were allowed",
		Technique: "host side: every 'allow' record of the run names a host:port of the policy; no record holds the secret value"}
	if err != nil {
		r.Result, r.Detail = Error, "egress log: "+err.Error()
		return r
	}
	allowed, denied := 0, 0
	for _, rec := range audit {
		if strings.Contains(fmt.Sprintf("%+v", rec), value) {
			r.Result, r.Detail = Bypassed, "an audit record holds the secret value"
			return r
		}
		if rec.Decision != "allow" {
			denied++
			continue
		}
		allowed++
		if !inPolicy(rec.Host, rec.Port, policy) {
			r.Result, r.Detail = Bypassed, fmt.Sprintf("allowed %s:%d (ip %s, rule %q) outside the policy %v", rec.Host, rec.Port, rec.IP, rec.Rule, policy)
			return r
		}
	}
	if denied == 0 {
		r.Result, r.Detail = Error, "no refused attempt in the audit log: the log is not observing the probes"
		return r
	}
	r.Result, r.Detail = Blocked, fmt.Sprintf("%d records: %d allowed (all in policy), %d refused", len(audit), allowed, denied)
	return r
}

func inPolicy(host string, port int, policy []string) bool {
	for _, p := range policy {
		if p == "*" {
			return true
		}
		h, ps, err := net.SplitHostPort(p)
		if err != nil {
			h, ps = p, ""
		}
		if !strings.EqualFold(strings.TrimSuffix(host, "."), h) {
			continue
		}
		if ps == "" && (port == 80 || port == 443) || ps == strconv.Itoa(port) {
			return true
		}
	}
	return false
}
