package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/store"
	"github.com/spacesandbox/space/internal/store/pgtest"
	"github.com/spacesandbox/space/internal/testenv"
)

// TestServeOnPostgres: `space serve --database postgres://…` keeps its
// records in Postgres (no space.db under --data), runs real sandboxes,
// admits warm claims and creates under a team's quota (429 past it),
// re-attaches its sandboxes after a kill -9, and a second sandbox-running
// server on the same database is refused before it recovers (it would
// take the first's sandboxes as its own).
func TestServeOnPostgres(t *testing.T) {
	url := pgtest.URL(t)
	s := startServer(t, "", "--database", url, "--pool-size", "1", "--snapshot-interval", "-1")
	if !strings.Contains(s.logText(), "store=postgres") {
		t.Errorf("the server does not say it serves from Postgres")
	}
	if _, err := os.Stat(filepath.Join(s.data, "space.db")); !os.IsNotExist(err) {
		t.Errorf("space.db under --data with --database postgres: %v", err)
	}
	key := s.teamKey("pg-a")
	if code := s.do("PUT", "/v1/teams/pg-a/quota", s.key, map[string]int{"max_sandboxes": 2}, nil); code != 200 {
		t.Fatalf("set quota: %d", code)
	}
	// Three creates at once (one may take the warm sandbox) against 2.
	var mu sync.Mutex
	var made []string
	refused := 0
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			var out struct {
				ID string `json:"id"`
				apiError
			}
			code := s.do("POST", "/v1/sandboxes", key, map[string]any{}, &out)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case code == 201:
				made = append(made, out.ID)
			case code == 429 && out.Error == "quota_exceeded":
				refused++
			default:
				t.Errorf("create under a quota: %d %+v", code, out)
			}
		})
	}
	wg.Wait()
	if len(made) != 2 || refused != 1 {
		t.Fatalf("3 creates with room for 2: %d made, %d refused", len(made), refused)
	}
	id := made[0]
	s.mustLive(id, "created on postgres")

	st, err := store.OpenPostgres(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if sb, err := st.GetSandbox(t.Context(), id); err != nil || sb.State != "running" || sb.Team != "pg-a" {
		t.Fatalf("the sandbox's record in Postgres: %+v, %v", sb, err)
	}

	// A second server on the same database, its own data dir: refused.
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, spaceBin(t), "serve", "--data", t.TempDir(), "--database", url,
		"--listen", "127.0.0.1:0", "--cache", testenv.CacheDir(), "--runsc", testenv.Runsc(t), "--agent", testenv.Agent(t),
		"--pool-size", "-1").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "another space server runs sandboxes on this database") {
		t.Errorf("a second sandbox-running server on one database: %v\n%s", err, tail(string(out), 2000))
	}
	s.mustLive(id, "after the second server was refused")

	s.kill9()
	s.start()
	s.mustLive(id, "after kill -9 and restart")
}
