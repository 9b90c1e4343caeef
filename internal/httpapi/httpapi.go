// Package httpapi serves space's public REST API (/v1, JSON and SSE), the
// health endpoint and metrics. It owns authentication and the one mapping
// from error classes to HTTP status codes; every operation is delegated to
// the sandbox service.
package httpapi

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/portproxy"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

// maxJSONBody caps JSON request bodies; file uploads are streamed and not
// subject to it.
const maxJSONBody = 1 << 20

// Templates is what the API needs of the template registry.
type Templates interface {
	List(ctx context.Context) ([]store.Template, error)
	Build(ctx context.Context, name string, progress func(string)) (store.Template, error)
}

// Health reports whether the server can create sandboxes.
type Health func() (ok bool, detail string)

// Config wires the API.
type Config struct {
	Service   *sandbox.Service
	Store     *store.Store
	Templates Templates
	Pools     Pools // nil: pools change only with a restart
	Health    Health
	OpenAPI   []byte
	Gatherer  prometheus.Gatherer
	Log       *slog.Logger
	Security  SecurityRunner // nil: the security probe endpoints answer 501
}

// API is the HTTP handler.
type API struct {
	cfg   Config
	svc   *sandbox.Service
	log   *slog.Logger
	mux   *http.ServeMux
	ports *portproxy.Proxy
	// routes are the API key's operations as registered ("METHOD /path";
	// no method: every method) and whether each counts against the
	// team's requests per second: what TestOpenAPIMatchesRoutes holds the
	// specification to.
	routes []route
}

type route struct {
	pattern string
	limited bool
}

// New builds the handler.
func New(cfg Config) *API {
	a := &API{cfg: cfg, svc: cfg.Service, log: cfg.Log, mux: http.NewServeMux()}
	a.ports = portproxy.New(a.svc.DialPortFrom)
	m := a.mux
	m.HandleFunc("GET /healthz", a.healthz)
	if cfg.Gatherer != nil { // else the server serves /metrics elsewhere (--metrics-listen)
		m.Handle("GET /metrics", promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{}))
	}
	m.HandleFunc("GET /v1/openapi.yaml", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/yaml")
		w.Write(cfg.OpenAPI)
	})
	auth := func(pattern string, h func(http.ResponseWriter, *http.Request, sandbox.Caller)) {
		m.HandleFunc(pattern, a.authed(a.rateLimited(h)))
		a.routes = append(a.routes, route{pattern, true})
	}
	auth("POST /v1/sandboxes", a.createSandbox)
	auth("GET /v1/sandboxes", a.listSandboxes)
	auth("GET /v1/sandboxes/{id}", a.getSandbox)
	auth("DELETE /v1/sandboxes/{id}", a.killSandbox)
	auth("POST /v1/sandboxes/{id}/timeout", a.setTimeout)
	auth("GET /v1/sandboxes/{id}/metrics", a.usage)
	auth("POST /v1/sandboxes/{id}/pause", a.pause)
	auth("POST /v1/sandboxes/{id}/resume", a.resume)
	auth("POST /v1/sandboxes/{id}/snapshots", a.createSnapshot)
	auth("GET /v1/sandboxes/{id}/snapshots", a.listSnapshots)
	auth("POST /v1/sandboxes/{id}/restore", a.restore)
	auth("POST /v1/sandboxes/{id}/fork", a.fork)
	auth("GET /v1/sandboxes/{id}/network", a.getNetwork)
	auth("PUT /v1/sandboxes/{id}/network", a.setNetwork)
	auth("GET /v1/sandboxes/{id}/egress", a.egressLog)
	auth("POST /v1/secrets", a.putSecret)
	auth("GET /v1/secrets", a.listSecrets)
	auth("DELETE /v1/secrets/{name}", a.deleteSecret)
	auth("GET /v1/snapshots/diff", a.diffSnapshots)
	auth("GET /v1/snapshots/{sid}", a.getSnapshot)
	auth("DELETE /v1/snapshots/{sid}", a.deleteSnapshot)
	auth("GET /v1/snapshots/{sid}/files", a.snapshotFiles)
	auth("POST /v1/sandboxes/{id}/exec", a.exec)
	auth("GET /v1/sandboxes/{id}/processes", a.processes)
	auth("GET /v1/sandboxes/{id}/commands", a.commands)
	auth("GET /v1/sandboxes/{id}/processes/{pid}/events", a.events)
	auth("POST /v1/sandboxes/{id}/processes/{pid}/stdin", a.stdin)
	auth("POST /v1/sandboxes/{id}/processes/{pid}/signal", a.signal)
	auth("PUT /v1/sandboxes/{id}/files", a.writeFile)
	auth("GET /v1/sandboxes/{id}/files", a.readFile)
	auth("DELETE /v1/sandboxes/{id}/files", a.removeFile)
	auth("GET /v1/sandboxes/{id}/files/stat", a.statFile)
	auth("GET /v1/sandboxes/{id}/files/list", a.listFiles)
	auth("POST /v1/sandboxes/{id}/files/mkdir", a.mkdir)
	auth("POST /v1/sandboxes/{id}/files/move", a.move)
	auth("GET /v1/sandboxes/{id}/files/watch", a.watch)
	auth("GET /v1/sandboxes/{id}/files/history", a.fileHistory)
	auth("GET /v1/sandboxes/{id}/pty", a.pty)
	// A sandbox's own server: its traffic (a page and its assets) is not
	// counted against the team's API rate.
	for _, pattern := range []string{"/v1/sandboxes/{id}/ports/{port}/{path...}", "/v1/sandboxes/{id}/ports/{port}"} { // every method
		m.HandleFunc(pattern, a.authed(a.portProxy))
		a.routes = append(a.routes, route{pattern, false})
	}
	auth("GET /v1/templates", a.listTemplates)
	auth("POST /v1/templates/{name}/build", a.buildTemplate)
	auth("GET /v1/pools", a.listPools)
	auth("PUT /v1/pools/{template}", a.putPool)
	auth("DELETE /v1/pools/{template}", a.deletePool)
	auth("POST /v1/keys", a.createKey)
	auth("GET /v1/keys", a.listKeys)
	auth("DELETE /v1/keys/{id}", a.deleteKey)
	auth("GET /v1/teams/{team}/quota", a.getQuota)
	auth("PUT /v1/teams/{team}/quota", a.putQuota)
	auth("DELETE /v1/teams/{team}/quota", a.deleteQuota)
	auth("POST /v1/security/probe", a.securityProbe)
	auth("GET /v1/security/report", a.securityReport)
	m.HandleFunc("/", a.noRoute)
	return a
}

// noRoute answers what no pattern took: 405 with an Allow header when the
// path exists under other methods (the catch-all pattern hides the mux's own
// 405), else 404; both as JSON errors.
func (a *API) noRoute(w http.ResponseWriter, r *http.Request) {
	var allow []string
	for _, m := range []string{"GET", "POST", "PUT", "DELETE"} {
		if m == r.Method {
			continue
		}
		probe := &http.Request{Method: m, URL: r.URL, Host: r.Host, Header: http.Header{}}
		if _, pattern := a.mux.Handler(probe); pattern != "" && pattern != "/" {
			allow = append(allow, m)
		}
	}
	if len(allow) > 0 {
		if slices.Contains(allow, "GET") {
			allow = append(allow, "HEAD")
		}
		w.Header().Set("Allow", strings.Join(allow, ", "))
		a.writeError(w, r, errdefs.Newf(errdefs.ErrMethodNotAllowed, "%s %s: method not allowed (allowed: %s)", r.Method, r.URL.Path, strings.Join(allow, ", ")))
		return
	}
	a.writeError(w, r, errdefs.NotFound("no route for %s %s", r.Method, r.URL.Path))
}

// ServeHTTP implements http.Handler: panics become 500s, every request is
// logged once.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rw := &statusWriter{ResponseWriter: w, status: 200}
	defer func() {
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				panic(p)
			}
			a.log.Error("panic in handler", "path", r.URL.Path, "panic", p)
			if !rw.wrote {
				a.writeError(rw, r, fmt.Errorf("panic: %v", p))
			}
		}
		a.log.Debug("http", "method", r.Method, "path", r.URL.Path, "status", rw.status, "ms", time.Since(start).Milliseconds())
	}()
	a.mux.ServeHTTP(rw, r)
}

type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach Flush and Hijack.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) Flush() {
	w.wrote = true
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (a *API) healthz(w http.ResponseWriter, r *http.Request) {
	ok, detail := a.cfg.Health()
	if !ok {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "starting", "detail": detail})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// HashKey is how API keys are stored: their SHA-256.
func HashKey(key string) []byte {
	h := sha256.Sum256([]byte(key))
	return h[:]
}

// APIKey returns the request's API key: the X-API-Key header if it is
// set, else Authorization: Bearer. inAuthorization reports whether the
// Authorization header carries the key; when it does not, Authorization
// belongs to whatever the request is for (an app behind a sandbox port).
func APIKey(r *http.Request) (key string, inAuthorization bool) {
	auth := r.Header.Get("Authorization")
	if key = strings.TrimSpace(r.Header.Get("X-Api-Key")); key != "" {
		return key, strings.Contains(auth, key)
	}
	if k, ok := strings.CutPrefix(auth, "Bearer "); ok {
		return strings.TrimSpace(k), true
	}
	return "", false
}

func (a *API) authed(h func(http.ResponseWriter, *http.Request, sandbox.Caller)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key, _ := APIKey(r)
		if key == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="space"`)
			a.writeError(w, r, errdefs.Newf(errdefs.ErrUnauthenticated, "missing API key: send Authorization: Bearer <api key> or X-API-Key: <api key>"))
			return
		}
		k, err := a.cfg.Store.KeyByHash(r.Context(), HashKey(key))
		if err != nil {
			if errors.Is(err, errdefs.ErrNotFound) {
				err = errdefs.Newf(errdefs.ErrUnauthenticated, "invalid API key")
			}
			a.writeError(w, r, err)
			return
		}
		h(w, r, sandbox.Caller{Team: k.Team, Admin: k.Admin})
	}
}

// rateLimited takes each request from its team's rate limit
// (Service.AllowRequest) before h runs.
func (a *API) rateLimited(h func(http.ResponseWriter, *http.Request, sandbox.Caller)) func(http.ResponseWriter, *http.Request, sandbox.Caller) {
	return func(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
		if err := a.svc.AllowRequest(r.Context(), c); err != nil {
			a.writeError(w, r, err)
			return
		}
		h(w, r, c)
	}
}

// ErrorBody is the JSON body of every error response.
type ErrorBody struct {
	Code    int    `json:"code"`
	Error   string `json:"error"`
	Message string `json:"message"`
	State   string `json:"state,omitempty"`
}

func errorBody(err error) (ErrorBody, bool) {
	code, status := errdefs.Classify(err)
	b := ErrorBody{Code: status, Error: code, Message: err.Error()}
	var ce *sandbox.ConflictError
	if errors.As(err, &ce) {
		b.State = ce.State
	}
	if status == 500 {
		b.Message = "internal error"
		return b, true
	}
	return b, false
}

// writeError is the one place an error becomes an HTTP response.
func (a *API) writeError(w http.ResponseWriter, r *http.Request, err error) {
	b, internal := errorBody(err)
	switch {
	case internal && r.Context().Err() != nil:
		// The client went away mid-request: nothing failed on our side.
		a.log.Debug("request ended by the client", "method", r.Method, "path", r.URL.Path, "err", err)
	case internal:
		a.log.Error("internal error", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	if errors.Is(err, errdefs.ErrRateLimited) {
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, b.Code, b)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// decode reads a JSON body strictly: unknown fields, trailing data and
// oversized bodies are invalid arguments.
func decode(r *http.Request, v any) error {
	body := bufio.NewReader(http.MaxBytesReader(nil, r.Body, maxJSONBody))
	// Only an object: a bare null (or a number, string, array) would decode
	// into the zero request and act on defaults the caller never chose.
	for {
		c, err := body.ReadByte()
		if err != nil {
			break // empty or unreadable: the decoder says which below
		}
		if c == ' ' || c == '\t' || c == '\n' || c == '\r' {
			continue
		}
		_ = body.UnreadByte()
		if c != '{' {
			return errdefs.InvalidArgument("request body: expected a JSON object")
		}
		break
	}
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			return errdefs.Newf(errdefs.ErrTooLarge, "request body larger than %d bytes", maxJSONBody)
		case errors.Is(err, io.EOF):
			return errdefs.InvalidArgument("request body: expected a JSON object")
		default:
			return errdefs.InvalidArgument("request body: %v", err)
		}
	}
	if dec.More() {
		return errdefs.InvalidArgument("request body: unexpected data after the JSON object")
	}
	return nil
}
