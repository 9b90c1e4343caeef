package server

import (
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/spacesandbox/space/internal/egress"
	"github.com/spacesandbox/space/internal/sandbox"
)

// newEgress builds the egress proxy: strict defaults, plus only what the
// operator explicitly configured.
func newEgress(cfg Config, log *slog.Logger) (sandbox.Egress, error) {
	ecfg := egress.Config{Logger: log.With("component", "egress")}
	if cfg.EgressHosts != "" {
		ecfg.Hosts = map[string][]net.IP{}
		for _, kv := range strings.Split(cfg.EgressHosts, ",") {
			name, ip, ok := strings.Cut(strings.TrimSpace(kv), "=")
			addr := net.ParseIP(ip)
			if !ok || name == "" || addr == nil {
				return sandbox.Egress{}, fmt.Errorf("--egress-hosts: want name=ip, got %q", kv)
			}
			ecfg.Hosts[strings.ToLower(name)] = append(ecfg.Hosts[strings.ToLower(name)], addr)
		}
	}
	if cfg.EgressAllowCIDR != "" {
		for _, c := range strings.Split(cfg.EgressAllowCIDR, ",") {
			p, err := netip.ParsePrefix(strings.TrimSpace(c))
			if err != nil {
				return sandbox.Egress{}, fmt.Errorf("--egress-allow-cidr: %w", err)
			}
			ecfg.AllowCIDRs = append(ecfg.AllowCIDRs, p)
		}
	}
	if cfg.EgressRootCA != "" {
		pem, err := os.ReadFile(cfg.EgressRootCA)
		if err != nil {
			return sandbox.Egress{}, fmt.Errorf("--egress-root-ca: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil || pool == nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return sandbox.Egress{}, fmt.Errorf("--egress-root-ca: no certificate in %s", cfg.EgressRootCA)
		}
		ecfg.RootCAs = pool
	}
	cas, err := egress.NewCAStore(filepath.Join(cfg.DataDir, "egress", "ca"))
	if err != nil {
		return sandbox.Egress{}, err
	}
	ring := egress.NewRing(1000)
	ecfg.CAs, ecfg.Audit = cas, ring
	p, err := egress.New(ecfg)
	if err != nil {
		return sandbox.Egress{}, err
	}
	if len(ecfg.Hosts) > 0 || len(ecfg.AllowCIDRs) > 0 {
		log.Warn("egress operator overrides active", "hosts", cfg.EgressHosts, "allow_cidr", cfg.EgressAllowCIDR)
	}
	return sandbox.Egress{Proxy: p, Audit: ring, CAs: cas, SecretsDir: filepath.Join(cfg.DataDir, "egress", "secrets")}, nil
}
