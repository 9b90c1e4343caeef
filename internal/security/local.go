package security

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/spacesandbox/space/internal/errdefs"
)

// ReportFile is where Local keeps the last report, in the data dir.
const ReportFile = "security-report.json"

// Local runs the suite from inside `space serve` against the server's own
// API (found, like the CLI finds it, in the data dir's serve.json and
// api-key: the admin key), one run at a time, and keeps the last report in
// memory and in <data>/security-report.json so it survives a restart.
type Local struct {
	dataDir string
	log     *slog.Logger

	mu      sync.Mutex
	running bool
	last    *Report
}

// NewLocal returns the runner for a server's data dir, loading the last
// report if one was saved.
func NewLocal(dataDir string, log *slog.Logger) *Local {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l := &Local{dataDir: dataDir, log: log.With("component", "security")}
	if b, err := os.ReadFile(filepath.Join(dataDir, ReportFile)); err == nil {
		var r Report
		if json.Unmarshal(b, &r) == nil {
			l.last = &r
		}
	}
	return l
}

// Probe runs the suite. A second run while one is in progress is
// errdefs.ErrConflict; a bad request is errdefs.ErrInvalidArgument.
func (l *Local) Probe(ctx context.Context, req Request) (*Report, error) {
	if req.Allow != "" {
		if _, p, ok := strings.Cut(req.Allow, ":"); !ok || p == "" {
			return nil, errdefs.InvalidArgument("allow %q: want host:port", req.Allow)
		}
	}
	l.mu.Lock()
	if l.running {
		l.mu.Unlock()
		return nil, errdefs.Conflict("a security probe is already running")
	}
	l.running = true
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.running = false
		l.mu.Unlock()
	}()

	base, key, err := l.self()
	if err != nil {
		return nil, errdefs.Unavailable("security probe: %v", err)
	}
	port := 0
	if u, err := url.Parse(base); err == nil {
		port, _ = strconv.Atoi(u.Port())
	}
	rep, err := Run(ctx, NewClientTarget(base, key), Options{Request: req, APIPort: port, Log: l.log})
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.last = rep
	l.mu.Unlock()
	if b, err := json.MarshalIndent(rep, "", "  "); err == nil {
		if err := writeAtomic(filepath.Join(l.dataDir, ReportFile), b); err != nil {
			l.log.Warn("saving security report", "err", err)
		}
	}
	l.log.Info("security probe done", "probes", rep.Probes, "bypassed", rep.Bypassed, "errors", rep.Errors)
	return rep, nil
}

// Last returns the last report (errdefs.ErrNotFound before any run).
func (l *Local) Last(context.Context) (*Report, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last == nil {
		return nil, errdefs.NotFound("no security probe has run on this server yet")
	}
	return l.last, nil
}

// self finds this server's URL and admin key in its data dir.
func (l *Local) self() (string, string, error) {
	b, err := os.ReadFile(filepath.Join(l.dataDir, "serve.json"))
	if err != nil {
		return "", "", err
	}
	var sf struct {
		URL string `json:"url"`
	}
	if err := json.Unmarshal(b, &sf); err != nil || sf.URL == "" {
		return "", "", errors.New("serve.json has no url")
	}
	k, err := os.ReadFile(filepath.Join(l.dataDir, "api-key"))
	if err != nil {
		return "", "", fmt.Errorf("admin key: %w", err)
	}
	return sf.URL, strings.TrimSpace(string(k)), nil
}

func writeAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-security-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
