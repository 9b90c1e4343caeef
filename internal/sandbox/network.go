package sandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spacesandbox/space/internal/agentclient"
	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/egress"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store"
)

// Egress wires the host-side proxy into the service. Sandboxes have no
// network interface; a sandbox with a network policy gets a loopback proxy
// endpoint from its agent, whose connections are tunnelled to Proxy.
type Egress struct {
	Proxy *egress.Proxy
	Audit *egress.Ring
	CAs   *egress.CAStore
	// SecretsDir holds one encrypted secret store per team.
	SecretsDir string
	// Listen is the in-sandbox proxy endpoint (default 127.0.0.1:3128).
	Listen string
}

type egressState struct {
	Egress
	mu      sync.Mutex
	secrets map[string]*egress.SecretStore // by team
}

// SetEgress enables network policies on the service.
func (s *Service) SetEgress(e Egress) {
	if e.Listen == "" {
		e.Listen = "127.0.0.1:3128"
	}
	s.egress = &egressState{Egress: e, secrets: map[string]*egress.SecretStore{}}
}

// NetworkSpec is a sandbox's network policy as a caller writes it: allowed
// destinations ("api.github.com", "*.pythonhosted.org:443", "*" for the
// public internet, a CIDR) and denied ones (deny wins). Empty: no network.
type NetworkSpec struct {
	Allow []string `json:"allow"`
	Deny  []string `json:"deny"`
}

func (n NetworkSpec) empty() bool { return len(n.Allow) == 0 && len(n.Deny) == 0 }

func (n NetworkSpec) parse() (egress.Policy, error) {
	for _, r := range append(slicesClone(n.Allow), n.Deny...) {
		if strings.Contains(r, ",") {
			return egress.Policy{}, errdefs.InvalidArgument("network: one destination per list entry, got %q", r)
		}
	}
	p, err := egress.ParsePolicy(strings.Join(n.Allow, ","), strings.Join(n.Deny, ","))
	if err != nil {
		return p, fmt.Errorf("network: %w", err)
	}
	return p, nil
}

func slicesClone(s []string) []string { return append([]string(nil), s...) }

func (e *egressState) store(team string) (*egress.SecretStore, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if st := e.secrets[team]; st != nil {
		return st, nil
	}
	st, err := egress.NewSecretStore(filepath.Join(e.SecretsDir, team))
	if err != nil {
		return nil, err
	}
	e.secrets[team] = st
	return st, nil
}

// SecretRequest stores a secret host-side.
type SecretRequest struct {
	Name   string           `json:"name"`
	Value  string           `json:"value"`
	Hosts  []string         `json:"hosts"`
	Inject egress.Injection `json:"inject"`
}

// PutSecret stores (or replaces) one of the caller's team's secrets,
// encrypted at rest. Its value is never returned by any call.
func (s *Service) PutSecret(ctx context.Context, c Caller, req SecretRequest) (store.SecretMeta, error) {
	if s.egress == nil {
		return store.SecretMeta{}, errdefs.NotSupported("egress is not enabled on this server")
	}
	sec := egress.Secret{Name: req.Name, Value: []byte(req.Value), Hosts: req.Hosts, Inject: req.Inject}
	if err := sec.Validate(); err != nil {
		return store.SecretMeta{}, err
	}
	if len(req.Hosts) == 0 {
		return store.SecretMeta{}, errdefs.InvalidArgument("hosts: a secret must be bound to at least one host")
	}
	st, err := s.egress.store(c.Team)
	if err != nil {
		return store.SecretMeta{}, err
	}
	if err := st.Put(sec); err != nil {
		return store.SecretMeta{}, err
	}
	m := store.SecretMeta{Team: c.Team, Name: req.Name, Hosts: req.Hosts, CreatedAt: s.now().UTC()}
	if err := s.store.PutSecretMeta(ctx, m); err != nil {
		return m, err
	}
	s.log.Info("secret stored", "team", c.Team, "secret", req.Name)
	s.rebindSecret(ctx, c.Team, req.Name)
	return m, nil
}

// Secrets lists the caller's team's secrets (names and hosts only).
func (s *Service) Secrets(ctx context.Context, c Caller) ([]store.SecretMeta, error) {
	return s.store.ListSecretMeta(ctx, c.Team)
}

// DeleteSecret removes a secret. Running sandboxes bound to it stop
// getting it injected at once (their next request; an intercepted
// connection re-reads the bindings per request).
func (s *Service) DeleteSecret(ctx context.Context, c Caller, name string) error {
	if s.egress == nil {
		return errdefs.NotSupported("egress is not enabled on this server")
	}
	if err := s.store.DeleteSecretMeta(ctx, c.Team, name); err != nil {
		return err
	}
	st, err := s.egress.store(c.Team)
	if err != nil {
		return err
	}
	if err := st.Delete(name); err != nil {
		return err
	}
	s.rebindSecret(ctx, c.Team, name)
	return nil
}

// rebindSecret gives the proxy the current bindings of every attached
// sandbox of team whose network names secret name: a deleted secret (a
// leaked token) is no longer injected, a replaced one injects its new
// value for its new hosts. The proxy kept the value it was given at the
// sandbox's start until the sandbox ended.
func (s *Service) rebindSecret(ctx context.Context, team, name string) {
	s.mu.Lock()
	ids := make([]string, 0, len(s.live))
	for id := range s.live {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	st, err := s.egress.store(team)
	if err != nil {
		s.log.Error("secret rebind", "team", team, "err", err)
		return
	}
	for _, id := range ids {
		sb, err := s.store.GetSandbox(ctx, id)
		if err != nil || sb.Team != team {
			continue
		}
		n, err := s.store.GetNetwork(ctx, id)
		if err != nil || !slices.Contains(slices.Collect(maps.Values(n.Secrets)), name) {
			continue
		}
		if err := s.egress.Proxy.BindSecrets(id, s.boundSecrets(st, id, n)); err != nil {
			s.log.Error("secret rebind", "sandbox", id, "secret", name, "err", err)
		}
	}
}

// boundSecrets is a network record's placeholder → secret map for the
// proxy; a secret that no longer exists is left out (its placeholder is
// injected nowhere) rather than failing the sandbox's whole egress.
func (s *Service) boundSecrets(st *egress.SecretStore, id string, n store.Network) map[string]egress.Secret {
	bound := map[string]egress.Secret{}
	for ph, name := range n.Secrets {
		sec, err := st.Get(name)
		if err != nil {
			s.log.Warn("egress: a bound secret is gone; its placeholder is injected nowhere", "sandbox", id, "secret", name, "err", err)
			continue
		}
		bound[ph] = sec
	}
	return bound
}

// bindNetwork applies a sandbox's network record to the proxy and its
// agent: policy, secret placeholders (minted here when mint is true) and
// the in-sandbox endpoint. It returns the env the sandbox's processes get.
func (s *Service) bindNetwork(ctx context.Context, sb store.Sandbox, n store.Network, agent *agentclient.Client, mint bool) (map[string]string, error) {
	e := s.egress
	pol, err := NetworkSpec{Allow: splitList(n.Allow), Deny: splitList(n.Deny)}.parse()
	if err != nil {
		return nil, err
	}
	st, err := e.store(sb.Team)
	if err != nil {
		return nil, err
	}
	if mint {
		// Fresh placeholders: a fork child can never replay its parent's.
		names := map[string]bool{}
		for _, name := range n.Secrets {
			names[name] = true
		}
		n.Secrets = map[string]string{}
		for name := range names {
			n.Secrets[egress.NewPlaceholder()] = name
		}
		if err := s.store.PutNetwork(ctx, n); err != nil {
			return nil, err
		}
	}
	bound := s.boundSecrets(st, sb.ID, n)
	env := map[string]string{}
	for ph, name := range n.Secrets {
		env[name] = ph
	}
	if err := e.Proxy.SetPolicy(sb.ID, pol); err != nil {
		return nil, err
	}
	if err := e.Proxy.BindSecrets(sb.ID, bound); err != nil {
		return nil, err
	}
	ca, err := e.Proxy.CAFor(sb.ID)
	if err != nil {
		return nil, err
	}
	id := sb.ID
	agent.HandleStreams(func(kind string, c net.Conn) {
		if kind != agentproto.StreamEgress {
			c.Close()
			return
		}
		e.Proxy.ServeConn(context.Background(), id, c)
	})
	proxyURL := "http://" + e.Listen
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy", "npm_config_proxy", "npm_config_https_proxy"} {
		env[k] = proxyURL
	}
	bundle := "/etc/ssl/certs/ca-certificates.crt"
	env["SSL_CERT_FILE"], env["REQUESTS_CA_BUNDLE"], env["PIP_CERT"], env["CURL_CA_BUNDLE"], env["GIT_SSL_CAINFO"] = bundle, bundle, bundle, bundle, bundle
	env["NODE_EXTRA_CA_CERTS"] = "/usr/local/share/ca-certificates/space-egress.crt"
	_ = ca
	// The caller's own choices win: initAgent copies this env over
	// sb.Env, so keys the caller set are left out here.
	noProxy := "localhost,127.0.0.1,::1"
	if v, ok := sb.Env["NO_PROXY"]; ok {
		noProxy = v
	} else if v, ok := sb.Env["no_proxy"]; ok {
		noProxy = v
	}
	for _, k := range []string{"NO_PROXY", "no_proxy"} {
		if _, ok := sb.Env[k]; !ok {
			env[k] = noProxy
		}
	}
	// Node's fetch ignores the proxy variables: the agent writes a preload
	// (agent.NodePreload) that routes it through the proxy.
	if _, ok := sb.Env["NODE_OPTIONS"]; !ok {
		env["NODE_OPTIONS"] = "--require " + nodePreload
	}
	return env, nil
}

// nodePreload is agent.NodePreload (the agent package is guest-side and
// not imported here).
const nodePreload = "/usr/local/lib/space/node-egress.cjs"

func splitList(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// initAgent sends the agent its identity: the sandbox env, plus, for a
// sandbox with a network, the egress endpoint, CA and proxy env.
func (s *Service) initAgent(ctx context.Context, sb store.Sandbox, agent *agentclient.Client, extra agentproto.InitRequest, mint bool) error {
	req := extra
	req.SandboxID = sb.ID
	req.Env = maps.Clone(sb.Env)
	if req.Env == nil {
		req.Env = map[string]string{}
	}
	if s.egress != nil {
		n, err := s.store.GetNetwork(ctx, sb.ID)
		switch {
		case err == nil:
			env, err := s.bindNetwork(ctx, sb, n, agent, mint)
			if err != nil {
				return err
			}
			maps.Copy(req.Env, env)
			ca, _ := s.egress.Proxy.CAFor(sb.ID)
			req.Egress = &agentproto.EgressInit{Listen: s.egress.Listen, CACertPEM: string(ca)}
		case !errors.Is(err, errdefs.ErrNotFound):
			return err
		}
	}
	ictx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return agent.Init(ictx, req)
}

// SetNetwork changes a running (or paused) sandbox's policy. New
// connections see it at once; open ones keep the decision they got.
func (s *Service) SetNetwork(ctx context.Context, c Caller, id string, spec NetworkSpec) (NetworkSpec, error) {
	if s.egress == nil {
		return spec, errdefs.NotSupported("egress is not enabled on this server")
	}
	if _, err := spec.parse(); err != nil {
		return spec, err
	}
	sb, l, err := s.liveOf(ctx, c, id, StateRunning)
	if err != nil {
		return spec, err
	}
	// It must finish or be undone even if its client goes away.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	n, err := s.store.GetNetwork(ctx, id)
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return spec, err
	}
	had := err == nil
	n.SandboxID, n.Allow, n.Deny = id, strings.Join(spec.Allow, ","), strings.Join(spec.Deny, ",")
	if n.Secrets == nil {
		n.Secrets = map[string]string{}
	}
	if err := s.store.PutNetwork(ctx, n); err != nil {
		return spec, err
	}
	if had {
		pol, _ := spec.parse()
		return spec, s.egress.Proxy.SetPolicy(id, pol)
	}
	// First policy of a sandbox created without network: open its
	// endpoint now. If the agent does not take it, the record goes again:
	// kept, a retry would find it and only change the proxy's policy,
	// and the sandbox would never get its endpoint, CA and proxy env.
	if err := s.initAgent(ctx, sb, l.agent, agentproto.InitRequest{}, false); err != nil {
		s.forgetNetwork(id)
		if derr := s.store.DeleteNetwork(ctx, id); derr != nil {
			s.log.Error("set network: undo the record", "sandbox", id, "err", derr)
		}
		return spec, err
	}
	return spec, nil
}

// Network returns a sandbox's policy.
func (s *Service) Network(ctx context.Context, c Caller, id string) (NetworkSpec, []string, error) {
	if _, err := s.get(ctx, c, id); err != nil {
		return NetworkSpec{}, nil, err
	}
	n, err := s.store.GetNetwork(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return NetworkSpec{}, nil, nil
	}
	if err != nil {
		return NetworkSpec{}, nil, err
	}
	var names []string
	for _, name := range n.Secrets {
		names = append(names, name)
	}
	return NetworkSpec{Allow: splitList(n.Allow), Deny: splitList(n.Deny)}, names, nil
}

// EgressLog returns a sandbox's most recent egress attempts.
func (s *Service) EgressLog(ctx context.Context, c Caller, id string, limit int) ([]egress.Record, error) {
	if _, err := s.get(ctx, c, id); err != nil {
		return nil, err
	}
	if s.egress == nil {
		return nil, nil
	}
	if limit <= 0 || limit > 1000 {
		limit = 1000
	}
	return s.egress.Proxy.Records(id, limit), nil
}

// forgetNetwork drops a destroyed sandbox's proxy state.
func (s *Service) forgetNetwork(id string) {
	if s.egress == nil {
		return
	}
	s.egress.Proxy.RemoveSandbox(id)
}

// dropNetwork is forgetNetwork for a sandbox that is gone for good
// (destroyed, or a create that failed): its interception CA goes too.
func (s *Service) dropNetwork(id string) {
	if s.egress == nil {
		return
	}
	s.egress.Proxy.RemoveSandbox(id)
	if err := s.egress.Proxy.DropCA(id); err != nil {
		s.log.Warn("egress: drop the CA of a destroyed sandbox", "sandbox", id, "err", err)
	}
}

// validateNetwork checks a create's network part: the policy parses and
// every secret exists for the caller's team.
func (s *Service) validateNetwork(ctx context.Context, c Caller, spec *NetworkSpec, secrets []string) error {
	if (spec == nil || spec.empty()) && len(secrets) == 0 {
		return nil
	}
	if s.egress == nil {
		return errdefs.NotSupported("egress is not enabled on this server")
	}
	if spec != nil {
		if _, err := spec.parse(); err != nil {
			return err
		}
	}
	for _, name := range secrets {
		if _, err := s.store.GetSecretMeta(ctx, c.Team, name); err != nil {
			return errdefs.NotFound("secret %q not found", name)
		}
	}
	return nil
}
