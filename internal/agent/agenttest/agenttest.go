// Package agenttest runs a real space-agent in the test process, reached
// over a unix socket the way the drivers reach theirs, for the tests of
// the packages that talk to it (not the agent's own: it imports it).
package agenttest

import (
	"context"
	"log/slog"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"testing"

	"github.com/spacesandbox/space/internal/agent"
	"github.com/spacesandbox/space/internal/agentclient"
)

// Dialer runs an agent as the current user with home as its home ("": a
// new directory) and returns what reaches it: each call waits for the
// agent's next connection. The agent stops when the test ends.
func Dialer(t testing.TB, home string) func(ctx context.Context) (net.Conn, error) {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	if home == "" {
		home = filepath.Join(dir, "home")
		if err := os.Mkdir(home, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	a := agent.New(agent.Options{User: u.Username, Home: home})
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = a.Serve(ctx, agent.Dial("unix", sock))
	}()
	t.Cleanup(func() {
		cancel()
		ln.Close()
		<-served
		a.Close()
	})
	return agentclient.AcceptDialer(ln)
}

// Client is a client of a Dialer agent; it is closed when the test ends,
// before the agent stops.
func Client(t testing.TB, home string) *agentclient.Client {
	t.Helper()
	c := agentclient.New(Dialer(t, home), slog.New(slog.DiscardHandler))
	t.Cleanup(func() { c.Close() })
	return c
}
