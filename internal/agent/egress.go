package agent

import (
	"bytes"
	"io"
	"net"
	"os"
	"sync"

	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/errdefs"
)

// Trust store locations of Debian-based templates.
const (
	caBundle   = "/etc/ssl/certs/ca-certificates.crt"
	caLocalPEM = "/usr/local/share/ca-certificates/space-egress.crt"
)

// startEgress opens the in-sandbox proxy endpoint (idempotent: after a
// restore the listener is already there with the rest of the agent's
// memory) and installs the sandbox's egress CA certificate.
func (a *Agent) startEgress(cfg agentproto.EgressInit) error {
	if cfg.CACertPEM != "" {
		if err := installCA([]byte(cfg.CACertPEM)); err != nil {
			a.log.Warn("install egress CA", "err", err)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.egressLn != nil {
		return nil
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:3128"
	}
	host, _, err := net.SplitHostPort(cfg.Listen)
	if err != nil || !net.ParseIP(host).IsLoopback() {
		return errdefs.InvalidArgument("egress listen address must be loopback, got %q", cfg.Listen)
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return errdefs.Newf(errdefs.ErrUnavailable, "egress listener: %v", err)
	}
	a.egressLn = ln
	go a.serveEgress(ln)
	return nil
}

// serveEgress tunnels every local connection to the host proxy over a
// stream of the current session. With no session (the host is away) the
// connection is closed: egress fails closed.
func (a *Agent) serveEgress(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go a.tunnel(c)
	}
}

func (a *Agent) tunnel(c net.Conn) {
	defer c.Close()
	a.mu.Lock()
	sess := a.sess
	a.mu.Unlock()
	if sess == nil {
		return
	}
	st, err := sess.OpenStream()
	if err != nil {
		return
	}
	defer st.Close()
	if _, err := io.WriteString(st, agentproto.StreamEgress+"\n"); err != nil {
		return
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		io.Copy(st, c)
		st.Close() // yamux: half-close our sending side
	}()
	io.Copy(c, st)
	if tc, ok := c.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	wg.Wait()
}

// installCA adds pem to the system bundle (once) and as a local CA file,
// so curl, git, pip, Python and Node (NODE_EXTRA_CA_CERTS) trust it.
func installCA(pem []byte) error {
	if err := os.MkdirAll("/usr/local/share/ca-certificates", 0o755); err == nil {
		_ = os.WriteFile(caLocalPEM, pem, 0o644)
	}
	cur, err := os.ReadFile(caBundle)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	if bytes.Contains(cur, bytes.TrimSpace(pem)) {
		return nil
	}
	f, err := os.OpenFile(caBundle, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	if len(cur) > 0 && cur[len(cur)-1] != '\n' {
		f.WriteString("\n")
	}
	_, err = f.Write(append(bytes.TrimSpace(pem), '\n'))
	return err
}
