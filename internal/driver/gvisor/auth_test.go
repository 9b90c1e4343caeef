package gvisor_test

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/spacesandbox/space/internal/agentclient"
	"github.com/spacesandbox/space/internal/agentproto"
)

// serveImpostor answers the agent protocol on c as root inside a sandbox
// could: every Info says "impostor".
func serveImpostor(c net.Conn) {
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = io.Discard
	sess, err := yamux.Server(c, cfg)
	if err != nil {
		c.Close()
		return
	}
	http.Serve(sess, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"version":"impostor"}`)
	}))
}

// TestAgentImpostorRefused: connections to the agent socket that do not
// authenticate are refused, and one that does (with the secret, as an
// impostor who read the agent's memory could) does not displace the
// session in use. Before, the newest connection won, whatever it was.
func TestAgentImpostorRefused(t *testing.T) {
	d, mk := newDriver(t)
	spec := mk()
	ctx := t.Context()
	inst, err := d.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Destroy(ctx)
	if err := inst.Start(ctx); err != nil {
		t.Fatal(err)
	}
	c := agentclient.New(inst.DialAgent, nil)
	defer c.Close()
	info, err := c.Info(ctx)
	if err != nil || info.Version != agentproto.Version {
		t.Fatalf("Info: %+v %v", info, err)
	}
	// The host keeps its copy; the agent's file is gone once it connected.
	fi, err := os.Stat(filepath.Join(spec.StateDir, "agent.secret"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("host copy of the secret: %v %v", fi, err)
	}
	if _, err := os.Stat(filepath.Join(spec.StateDir, "run", "agent.secret")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the agent's secret file after its first connection: %v, want gone", err)
	}
	secret, err := agentproto.ReadSecret(filepath.Join(spec.StateDir, "agent.secret"))
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(spec.StateDir, "run", "agent.sock")
	for _, imp := range []struct {
		name   string
		secret []byte
	}{{"no handshake", nil}, {"another secret", agentproto.NewSecret()}, {"the secret", secret}} {
		conn, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		if imp.secret != nil {
			conn.SetDeadline(time.Now().Add(30 * time.Second))
			if err := agentproto.AnswerAuth(conn, imp.secret); err != nil {
				t.Fatalf("%s: %v", imp.name, err)
			}
			conn.SetDeadline(time.Time{})
		}
		go serveImpostor(conn)
		for range 10 {
			info, err := c.Info(ctx)
			if err != nil || info.Version != agentproto.Version {
				t.Errorf("%s: Info answered %+v %v, want the real agent's", imp.name, info, err)
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		conn.Close()
	}
}
