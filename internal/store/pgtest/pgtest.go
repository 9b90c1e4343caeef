// Package pgtest starts a throwaway PostgreSQL cluster for tests: the
// Debian package's server binaries (initdb, postgres), run as a child of
// the test binary, in a temporary directory, listening only on a unix
// socket there, with fsync off. It is started once per test binary, on
// the first URL call, and stopped by Main; each URL call creates a fresh
// empty database in it.
//
// Nothing is skipped: without the binaries a test that asks for a URL
// fails, saying what to install (make deps installs the postgresql
// package). Running as root, the cluster runs as the postgres OS user
// (initdb refuses root).
//
// The cluster's default collation is ICU's English one, not C: ordering
// that relies on bytewise comparison (as SQLite's does) must say COLLATE
// "C", and a test notices when it does not.
package pgtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
)

// EnvBin names a directory holding initdb and postgres, to use instead of
// the newest /usr/lib/postgresql/*/bin.
const EnvBin = "SPACE_PG_BIN"

// startTimeout bounds initdb and the server's start on a loaded host.
const startTimeout = 2 * time.Minute

var (
	once    sync.Once
	running *cluster
	failed  error
)

type cluster struct {
	dir   string // data directory, socket and log
	cmd   *exec.Cmd
	exit  chan error // the server's exit
	admin *sql.DB    // to the postgres database, for CREATE DATABASE
	n     atomic.Int64
}

// Main runs the tests of m and then stops the cluster if one was started;
// call it from TestMain: os.Exit(pgtest.Main(m)).
func Main(m *testing.M) int {
	code := m.Run()
	if running != nil {
		if err := running.stop(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest:", err)
		}
	}
	return code
}

// URL returns the URL of a new, empty database on the test binary's
// cluster, starting the cluster on first use. It fails tb if the cluster
// cannot start.
func URL(tb testing.TB) string {
	tb.Helper()
	once.Do(func() { running, failed = start() })
	if failed != nil {
		tb.Fatalf("pgtest: %v", failed)
	}
	name := fmt.Sprintf("t%d", running.n.Add(1))
	if _, err := running.admin.ExecContext(context.Background(), `CREATE DATABASE `+name); err != nil {
		tb.Fatalf("pgtest: create database %s: %v", name, err)
	}
	return running.url(name)
}

func (c *cluster) url(db string) string {
	q := url.Values{}
	q.Set("host", c.dir)
	q.Set("sslmode", "disable")
	return "postgres://postgres@/" + db + "?" + q.Encode()
}

// BinDir returns the directory of the PostgreSQL server binaries.
func BinDir() (string, error) {
	if d := os.Getenv(EnvBin); d != "" {
		return d, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	// Newest major version first.
	sort.Slice(dirs, func(i, j int) bool { return major(dirs[i]) > major(dirs[j]) })
	for _, d := range dirs {
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	return "", errors.New("PostgreSQL server binaries (initdb, postgres) not found in /usr/lib/postgresql/*/bin: " +
		"install the Debian package postgresql (make deps does), or set " + EnvBin)
}

func major(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

func isExec(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

func start() (_ *cluster, err error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	cred, err := credential(dir)
	if err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "data")
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "--auth=trust",
		"-E", "UTF8", "--locale=C.UTF-8", "--locale-provider=icu", "--icu-locale=en", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	initdb.Dir = dir
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %v\n%s", err, out)
	}
	logf, err := os.Create(filepath.Join(dir, "postgres.log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	if cred != nil {
		os.Chown(logf.Name(), int(cred.Uid), int(cred.Gid))
	}
	cmd := exec.Command(filepath.Join(bin, "postgres"), "-D", data, "-k", dir,
		"-c", "listen_addresses=", "-c", "fsync=off", "-c", "synchronous_commit=off",
		"-c", "full_page_writes=off", "-c", "max_connections=200", "-c", "shared_buffers=32MB")
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	// SIGQUIT on the test binary's death: an immediate shutdown that
	// also ends the server's own children.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGQUIT}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	c := &cluster{dir: dir, cmd: cmd, exit: make(chan error, 1)}
	go func() { c.exit <- cmd.Wait() }()
	if err := c.waitReady(ctx); err != nil {
		c.stop()
		log, _ := os.ReadFile(filepath.Join(dir, "postgres.log"))
		return nil, fmt.Errorf("%w\npostgres log:\n%s", err, log)
	}
	return c, nil
}

// credential makes dir the postgres user's when running as root and
// returns that user's credential (nil: run as ourselves).
func credential(dir string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, the cluster runs as the postgres user, which does not exist (%v): install the Debian package postgresql", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func (c *cluster) waitReady(ctx context.Context) error {
	db, err := sql.Open("pgx", c.url("postgres"))
	if err != nil {
		return err
	}
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err = db.PingContext(pctx)
		cancel()
		if err == nil {
			c.admin = db
			return nil
		}
		select {
		case werr := <-c.exit:
			c.exit <- werr
			db.Close()
			return fmt.Errorf("postgres exited while starting: %v", werr)
		case <-ctx.Done():
			db.Close()
			return fmt.Errorf("postgres not ready after %v: %v", startTimeout, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stop shuts the server down (fast shutdown, then a kill) and removes its
// directory.
func (c *cluster) stop() error {
	if c.admin != nil {
		c.admin.Close()
	}
	c.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-c.exit:
	case <-time.After(20 * time.Second):
		c.cmd.Process.Kill()
		<-c.exit
	}
	return os.RemoveAll(c.dir)
}
