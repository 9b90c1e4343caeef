// Package e2b is space's E2B-compatible facade: the control-plane REST API
// the E2B SDKs call (create, connect, kill, list, timeout, pause, snapshots,
// fork, network, metrics) and the in-sandbox envd surface (the Connect
// services process.Process and filesystem.Filesystem, /files, /health),
// all on one listener. Sandbox traffic is told apart from control-plane
// traffic by the E2b-Sandbox-Id/E2b-Sandbox-Port headers or by a
// "<port>-<id>.<domain>" Host.
//
// It owns no sandbox logic: every operation maps onto internal/sandbox's
// Service, with the team of the caller's space API key (X-API-Key) or, for
// envd calls, of the sandbox whose access token was presented. The wire
// contract is docs/E2B.md and the e2b-protocol reference it cites.
package e2b

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/httpapi"
	"github.com/spacesandbox/space/internal/portproxy"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

// EnvdVersion is the envd version space reports. Every SDK feature gated at
// or below it is implemented (§3.7 of the wire reference): metrics,
// recursive watch, stdin:false, default user, closeStdin, octet-stream and
// gzip uploads. File metadata (0.6.2) is not, so nothing newer is claimed.
const EnvdVersion = "0.5.7"

// Ports inside a sandbox the SDK addresses.
const (
	EnvdPort        = 49983
	InterpreterPort = 49999
)

// Config wires the facade.
type Config struct {
	Service *sandbox.Service
	Store   *store.Store
	// DataDir keeps the key that derives per-sandbox envd access tokens
	// (so tokens survive a server restart).
	DataDir string
	// Domain, when set, is returned as the sandboxes' domain; unset (the
	// default) the SDK must be given E2B_SANDBOX_URL.
	Domain string
	Log    *slog.Logger
}

// Handler serves the control plane and the envd surface.
type Handler struct {
	cfg      Config
	svc      *sandbox.Service
	log      *slog.Logger
	tokenKey []byte
	control  http.Handler
	envd     http.Handler
	interp   http.Handler
	ports    *portproxy.Proxy
	procs    *processServer
	watchers *watchers
	metrics  *metricsHistory
	// interpState holds the code interpreter's contexts.
	interpState *interpreter
}

// New builds the handler.
func New(cfg Config) (*Handler, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	key, err := loadTokenKey(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("e2b token key: %w", err)
	}
	h := &Handler{cfg: cfg, svc: cfg.Service, log: cfg.Log.With("api", "e2b"), tokenKey: key, watchers: newWatchers(), metrics: newMetricsHistory()}
	h.control = h.controlMux()
	h.envd = h.envdMux()
	h.interpState = &interpreter{sandboxes: map[string]map[string]*codeContext{}}
	h.interp = h.interpreterMux()
	h.ports = portproxy.New(h.svc.DialPortFrom)
	return h, nil
}

// Serve listens on addr and serves until ctx ends. It returns once the
// listener is open (serving errors are logged) with a wait that returns
// when the server has shut down: requests in flight get a few seconds,
// then their contexts are cancelled and their connections closed.
func Serve(ctx context.Context, addr string, cfg Config) (wait func(), err error) {
	h, err := New(cfg)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("e2b listen: %w", err)
	}
	reqCtx, cancelRequests := context.WithCancel(context.WithoutCancel(ctx))
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10,
		BaseContext: func(net.Listener) context.Context { return reqCtx }}
	done := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		h.sampleMetrics(ctx)
	}()
	go func() {
		defer close(done)
		defer func() { <-sampled }()
		defer cancelRequests()
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		if srv.Shutdown(sctx) != nil {
			cancelRequests()
			_ = srv.Close()
		}
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			h.log.Error("e2b server", "err", err)
		}
	}()
	h.log.Info("serving E2B API", "url", "http://"+ln.Addr().String())
	return func() { <-done }, nil
}

// ServeHTTP routes sandbox traffic (by headers or Host) to envd and the
// rest to the control plane.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	defer func() {
		h.log.Debug("http", "method", r.Method, "path", r.URL.Path, "sandbox", r.Header.Get("E2b-Sandbox-Id"), "ms", time.Since(start).Milliseconds())
	}()
	id, port, ok := route(r)
	if !ok {
		h.control.ServeHTTP(w, r)
		return
	}
	switch port {
	case EnvdPort:
		h.serveEnvd(w, r, id)
	case InterpreterPort:
		h.serveInterpreter(w, r, id)
	default:
		h.servePort(w, r, id, port)
	}
}

// route finds the sandbox and port a request is for: the E2b-Sandbox-Id and
// E2b-Sandbox-Port headers, else a "<port>-<id>.<domain>" Host.
func route(r *http.Request) (id string, port int, ok bool) {
	if sid := r.Header.Get("E2b-Sandbox-Id"); sid != "" {
		port = EnvdPort
		if p := r.Header.Get("E2b-Sandbox-Port"); p != "" {
			n, err := strconv.Atoi(p)
			if err != nil {
				return "", 0, false
			}
			port = n
		}
		return spaceID(sid), port, true
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	label, _, found := strings.Cut(host, ".")
	if !found {
		return "", 0, false
	}
	p, sid, found := strings.Cut(label, "-")
	if !found {
		return "", 0, false
	}
	n, err := strconv.Atoi(p)
	if err != nil || n <= 0 || n > 65535 || sid == "" {
		return "", 0, false
	}
	return spaceID(sid), n, true
}

// E2B ids must match ^[a-z0-9]+$ (clients split Host names on '-'), so a
// space id "sb-xyz" is "xyz" on this API.
func e2bID(id string) string { return strings.TrimPrefix(id, "sb-") }

func spaceID(id string) string {
	if strings.HasPrefix(id, "sb-") {
		return id
	}
	return "sb-" + id
}

// accessToken is a sandbox's envd access token: an HMAC of its id, so it
// needs no storage and survives restarts.
func (h *Handler) accessToken(id string) string {
	m := hmac.New(sha256.New, h.tokenKey)
	m.Write([]byte(id))
	return "ea_" + hex.EncodeToString(m.Sum(nil))[:40]
}

// trafficToken guards the code interpreter's port; the SDK sends it as
// E2B-Traffic-Access-Token on every call there.
func (h *Handler) trafficToken(id string) string {
	m := hmac.New(sha256.New, h.tokenKey)
	m.Write([]byte("traffic:" + id))
	return "et_" + hex.EncodeToString(m.Sum(nil))[:40]
}

func loadTokenKey(dataDir string) ([]byte, error) {
	if dataDir == "" {
		k := make([]byte, 32)
		rand.Read(k)
		return k, nil
	}
	path := filepath.Join(dataDir, "e2b-token-key")
	if b, err := os.ReadFile(path); err == nil && len(b) >= 32 {
		return b, nil
	}
	k := make([]byte, 32)
	rand.Read(k)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, k, 0o600); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, err
	}
	return k, nil
}

// caller authenticates a control-plane request by its X-API-Key (a space
// API key).
func (h *Handler) caller(r *http.Request) (sandbox.Caller, error) {
	key, _ := httpapi.APIKey(r)
	if key == "" {
		return sandbox.Caller{}, errdefs.Newf(errdefs.ErrUnauthenticated, "missing X-API-Key (a space API key)")
	}
	k, err := h.cfg.Store.KeyByHash(r.Context(), httpapi.HashKey(key))
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return sandbox.Caller{}, errdefs.Newf(errdefs.ErrUnauthenticated, "invalid API key")
		}
		return sandbox.Caller{}, err
	}
	return sandbox.Caller{Team: k.Team, Admin: k.Admin}, nil
}
