package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/filelock"
	"github.com/spacesandbox/space/internal/httpapi"
	"github.com/spacesandbox/space/internal/store"
)

// Settings that would do harm are refused at start: a negative retention
// (every named snapshot "too old" at the first pass), a default timeout
// that is negative or over the cap, typos in the log settings and the
// default template, pool sizes out of range.
func TestValidateBounds(t *testing.T) {
	for _, tt := range []struct {
		name string
		set  func(*Config)
		want string
	}{
		{"negative retention", func(c *Config) { c.RetentionDays = -1 }, "--retention-days"},
		{"huge retention", func(c *Config) { c.RetentionDays = 1 << 40 }, "--retention-days"},
		{"negative default timeout", func(c *Config) { c.DefaultTimeoutS = -1 }, "--default-timeout"},
		{"default over the cap", func(c *Config) { c.MaxTimeoutS, c.DefaultTimeoutS = 60, 120 }, "over --max-timeout"},
		{"negative cap", func(c *Config) { c.MaxTimeoutS = -1 }, "--max-timeout"},
		{"snapshot interval", func(c *Config) { c.SnapshotIntervalS = -5 }, "--snapshot-interval"},
		{"pool size", func(c *Config) { c.PoolSize = -2 }, "--pool-size"},
		{"pool size too big", func(c *Config) { c.PoolSize = MaxPoolSize + 1 }, "--pool-size"},
		{"log level typo", func(c *Config) { c.LogLevel = "verbose" }, "--log-level"},
		{"log format typo", func(c *Config) { c.LogFormat = "yaml" }, "--log-format"},
		{"template typo", func(c *Config) { c.DefaultTemplate = "bsae" }, "--template"},
		{"e2b domain with a scheme", func(c *Config) { c.E2BDomain = "https://sb.example.com" }, "--e2b-domain"},
		{"e2b domain with a path", func(c *Config) { c.E2BDomain = "sb.example.com/x" }, "--e2b-domain"},
		{"database not postgres", func(c *Config) { c.Database = "mysql://db/space" }, "--database"},
		{"database a file", func(c *Config) { c.Database = "/var/lib/space/other.db" }, "--database"},
	} {
		var c Config
		tt.set(&c)
		c.Defaults()
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an error naming %s", tt.name, err, tt.want)
		}
	}
	for _, set := range []func(*Config){
		func(c *Config) {},
		func(c *Config) { c.PoolSize, c.SnapshotIntervalS = -1, -1 },
		func(c *Config) { c.DefaultTimeoutS, c.MaxTimeoutS, c.RetentionDays = 60, 60, 1 },
		func(c *Config) { c.LogLevel, c.LogFormat, c.DefaultTemplate = "debug", "json", "python-data" },
		func(c *Config) { c.E2BDomain = "sandboxes.example.com" },
		func(c *Config) { c.Database = "postgres://space:pw@db.internal/space" },
		func(c *Config) { c.Database = "postgresql://space@/space?host=/run/postgresql" },
		func(c *Config) { c.MaxTimeoutS = 60 }, // the default follows the cap down
	} {
		var c Config
		set(&c)
		c.Defaults()
		if err := c.Validate(); err != nil {
			t.Errorf("%+v refused: %v", c, err)
		}
	}
}

// A bootstrap key deleted through the API (revoked: it leaked) is not
// added back at the next start: the key file gets a new key. It came back
// as an admin key. A store with no admin key at all (reset) takes the
// file's key back.
func TestBootstrapKeyNotRevived(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.Open(ctx, filepath.Join(dir, "space.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	path, err := bootstrapKey(ctx, st, dir, log)
	if err != nil {
		t.Fatal(err)
	}
	read := func() string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	old := read()
	k, err := st.KeyByHash(ctx, httpapi.HashKey(old))
	if err != nil || !k.Admin {
		t.Fatalf("bootstrap key: %+v %v", k, err)
	}
	if err := st.CreateKey(ctx, store.Key{ID: httpapi.NewKeyID(), Hash: httpapi.HashKey(httpapi.NewKey()), Team: "admin", Admin: true, Name: "ops", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteKey(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := bootstrapKey(ctx, st, dir, log); err != nil {
		t.Fatal(err)
	}
	if _, err := st.KeyByHash(ctx, httpapi.HashKey(old)); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("the revoked key after a restart: %v, want not found", err)
	}
	if cur := read(); cur == old {
		t.Fatal("the key file still holds the revoked key")
	} else if k, err := st.KeyByHash(ctx, httpapi.HashKey(cur)); err != nil || !k.Admin {
		t.Fatalf("the key file's new key: %+v %v", k, err)
	}

	// A reset store (no admin key) takes the file's key back.
	dir2 := t.TempDir()
	st2, err := store.Open(ctx, filepath.Join(dir2, "space.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	if err := os.WriteFile(filepath.Join(dir2, KeyFile), []byte(old+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := bootstrapKey(ctx, st2, dir2, log); err != nil {
		t.Fatal(err)
	}
	if k, err := st2.KeyByHash(ctx, httpapi.HashKey(old)); err != nil || !k.Admin {
		t.Fatalf("a reset store did not take the file's key: %+v %v", k, err)
	}
}

// A second server on a data dir in use fails before it touches anything
// there (it ran the store's migrations under the first).
func TestDataDirLocked(t *testing.T) {
	dir := t.TempDir()
	unlock, err := filelock.Lock(context.Background(), filepath.Join(dir, LockFile))
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	defer func(w time.Duration) { dataDirLockWait = w }(dataDirLockWait)
	dataDirLockWait = 200 * time.Millisecond
	err = Run(context.Background(), Config{DataDir: dir, CacheDir: t.TempDir(), Listen: "127.0.0.1:0"})
	if err == nil || !strings.Contains(err.Error(), "in use by another space server") {
		t.Fatalf("Run on a locked data dir: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "space.db")); !os.IsNotExist(err) {
		t.Errorf("the second server opened the store: %v", err)
	}
}

// Every listener closes idle keep-alive connections and bounds headers.
func TestHTTPServerBounds(t *testing.T) {
	srv := NewHTTPServer(nil)
	if srv.IdleTimeout <= 0 || srv.ReadHeaderTimeout <= 0 || srv.MaxHeaderBytes <= 0 {
		t.Fatalf("server without bounds: idle %v, header %v, %d bytes", srv.IdleTimeout, srv.ReadHeaderTimeout, srv.MaxHeaderBytes)
	}
}
