package e2b

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

// templateAliases maps E2B template names onto space templates. Any other
// name is looked up as a space template as it is; a "snap-…" id creates
// the sandbox from that snapshot (E2B snapshots are templates).
var templateAliases = map[string]string{
	"":                    "base",
	"base":                "base",
	"code-interpreter-v1": InterpreterTemplate,
	"code-interpreter":    InterpreterTemplate,
}

// InterpreterTemplate is the space template E2B's code interpreter
// templates map to: python3 with pandas and matplotlib, and node. Its warm
// pools prestart the default Python kernel (KernelPrestart).
const InterpreterTemplate = "python-data"

func (h *Handler) controlMux() http.Handler {
	m := http.NewServeMux()
	auth := func(pattern string, f func(http.ResponseWriter, *http.Request, sandbox.Caller)) {
		m.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			c, err := h.caller(r)
			if err == nil {
				err = h.svc.AllowRequest(r.Context(), c)
			}
			if err != nil {
				h.writeError(w, r, err)
				return
			}
			f(w, r, c)
		})
	}
	auth("POST /sandboxes", h.create)
	auth("POST /v2/sandboxes", h.create)
	auth("GET /sandboxes", h.listV1)
	auth("GET /v2/sandboxes", h.list)
	auth("GET /sandboxes/{id}", h.getInfo)
	auth("DELETE /sandboxes/{id}", h.kill)
	auth("POST /sandboxes/{id}/connect", h.connect)
	auth("POST /v2/sandboxes/{id}/connect", h.connect)
	auth("POST /sandboxes/{id}/resume", h.connect)
	auth("POST /sandboxes/{id}/timeout", h.setTimeout)
	auth("POST /sandboxes/{id}/refreshes", h.refresh)
	auth("POST /sandboxes/{id}/pause", h.pause)
	auth("GET /sandboxes/{id}/metrics", h.metricsHandler)
	auth("POST /sandboxes/{id}/snapshots", h.createSnapshot)
	auth("GET /snapshots", h.listSnapshots)
	auth("DELETE /templates/{id}", h.deleteSnapshot)
	auth("GET /templates/aliases/{alias}", h.templateAlias)
	auth("POST /sandboxes/{id}/fork", h.fork)
	auth("PUT /sandboxes/{id}/network", h.updateNetwork)
	m.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		h.writeError(w, r, errdefs.NotFound("no route for %s %s", r.Method, r.URL.Path))
	})
	return m
}

// sandboxJSON is E2B's Sandbox (create/connect answer).
type sandboxJSON struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	ClientID           string  `json:"clientID"`
	Alias              string  `json:"alias,omitempty"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

// detailJSON is E2B's SandboxDetail and ListedSandbox.
type detailJSON struct {
	SandboxID           string            `json:"sandboxID"`
	TemplateID          string            `json:"templateID"`
	ClientID            string            `json:"clientID"`
	Alias               string            `json:"alias,omitempty"`
	CPUCount            int               `json:"cpuCount"`
	MemoryMB            int               `json:"memoryMB"`
	DiskSizeMB          int               `json:"diskSizeMB"`
	EnvdVersion         string            `json:"envdVersion"`
	StartedAt           time.Time         `json:"startedAt"`
	EndAt               time.Time         `json:"endAt"`
	State               string            `json:"state"`
	Metadata            map[string]string `json:"metadata"`
	AllowInternetAccess *bool             `json:"allowInternetAccess,omitempty"`
	Network             *networkJSON      `json:"network,omitempty"`
	Lifecycle           *lifecycleJSON    `json:"lifecycle,omitempty"`
	Domain              *string           `json:"domain"`
	EnvdAccessToken     string            `json:"envdAccessToken,omitempty"`
}

type networkJSON struct {
	AllowOut []string `json:"allowOut,omitempty"`
	DenyOut  []string `json:"denyOut,omitempty"`
}

type lifecycleJSON struct {
	OnTimeout  string `json:"onTimeout"`
	AutoResume bool   `json:"autoResume"`
}

// diskMB is what space reports as a sandbox's disk size: its disk_mb,
// the most its writable layer may fill.
func diskMB(sb store.Sandbox) int {
	if sb.DiskMB > 0 {
		return sb.DiskMB
	}
	return sandbox.DefaultDiskMB
}

func (h *Handler) domain() *string {
	if h.cfg.Domain == "" {
		return nil
	}
	d := h.cfg.Domain
	return &d
}

func (h *Handler) sandboxJSON(sb store.Sandbox) sandboxJSON {
	traffic := h.trafficToken(sb.ID)
	return sandboxJSON{
		SandboxID: e2bID(sb.ID), TemplateID: sb.Template, ClientID: "space",
		EnvdVersion: EnvdVersion, EnvdAccessToken: h.accessToken(sb.ID), Domain: h.domain(),
		TrafficAccessToken: &traffic,
	}
}

func (h *Handler) detailJSON(sb store.Sandbox, withToken bool) detailJSON {
	d := detailJSON{
		SandboxID: e2bID(sb.ID), TemplateID: sb.Template, ClientID: "space",
		CPUCount: sb.CPU, MemoryMB: sb.MemoryMB, DiskSizeMB: diskMB(sb), EnvdVersion: EnvdVersion,
		StartedAt: sb.CreatedAt.UTC(), EndAt: sb.ExpiresAt.UTC(), State: e2bState(sb.State),
		Metadata: sb.Metadata, Domain: h.domain(),
		Lifecycle: &lifecycleJSON{OnTimeout: sb.OnTimeout, AutoResume: sb.AutoResume},
	}
	if d.Metadata == nil {
		d.Metadata = map[string]string{}
	}
	if sb.ExpiresAt.IsZero() {
		d.EndAt = sb.UpdatedAt.UTC()
	}
	if withToken {
		d.EnvdAccessToken = h.accessToken(sb.ID)
	}
	return d
}

// e2bState names space states the E2B way (E2B has running and paused).
func e2bState(s string) string {
	switch s {
	case sandbox.StatePaused:
		return "paused"
	default:
		return "running"
	}
}

// createBody is NewSandbox (POST /sandboxes) and NewSandboxV2.
type createBody struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int              `json:"timeout"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             *struct {
		AllowOut []string `json:"allowOut"`
		DenyOut  []string `json:"denyOut"`
		// AllowPublicTraffic true makes the sandbox's getHost(port) URLs
		// answer without a token. E2B's default is true; space's is
		// false: only an explicit true opens them.
		AllowPublicTraffic *bool `json:"allowPublicTraffic"`
	} `json:"network"`
	AutoPause  bool `json:"autoPause"`
	AutoResume *struct {
		Enabled bool `json:"enabled"`
	} `json:"autoResume"`
	Secure *bool `json:"secure"`
}

// networkSpec maps E2B's network options onto space's egress policy.
// E2B's default is internet access; allow_internet_access:false without
// an allow list means no network at all. E2B's "deny all traffic"
// (ALL_TRAFFIC, 0.0.0.0/0; ::/0 too) with allowOut is an allow list: in
// E2B allowOut wins over denyOut, in space a deny wins, so kept as a deny
// CIDR it refused the allowed hosts' IPv4 addresses, and without allowOut
// it left every IPv6 address open in public mode.
func networkSpec(allowInternet *bool, allowOut, denyOut []string) *sandbox.NetworkSpec {
	spec := &sandbox.NetworkSpec{Allow: append([]string(nil), allowOut...)}
	denyAll := false
	for _, d := range denyOut {
		if d == "0.0.0.0/0" || d == "::/0" {
			denyAll = true
			continue
		}
		spec.Deny = append(spec.Deny, d)
	}
	internet := (allowInternet == nil || *allowInternet) && !denyAll
	if internet && len(spec.Allow) == 0 {
		spec.Allow = []string{"*"}
	}
	if len(spec.Allow) == 0 {
		return nil // nothing allowed: no network (a deny list alone changes nothing)
	}
	return spec
}

func (h *Handler) create(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	var b createBody
	if err := decodeJSON(r, &b); err != nil {
		h.writeError(w, r, err)
		return
	}
	// A sandbox claimed from a pool that prestarted the code interpreter's
	// default kernel keeps it (it gets the sandbox's env at the claim),
	// unless the env sets what a kernel reads only as it starts.
	req := sandbox.CreateRequest{Env: b.EnvVars, Metadata: b.Metadata, KeepPrestarted: !startupEnv(b.EnvVars)}
	if b.Timeout != nil {
		req.TimeoutS = *b.Timeout
	}
	if b.AutoPause {
		req.OnTimeout = "pause"
	}
	if b.AutoResume != nil && b.AutoResume.Enabled {
		if !b.AutoPause {
			h.writeError(w, r, errdefs.InvalidArgument("autoResume needs autoPause (lifecycle.onTimeout 'pause')"))
			return
		}
		req.AutoResume = true
	}
	if strings.HasPrefix(b.TemplateID, "snap-") {
		req.Snapshot = b.TemplateID
	} else {
		req.Template = b.TemplateID
		if t, ok := templateAliases[b.TemplateID]; ok {
			req.Template = t
		}
		var allow, deny []string
		if b.Network != nil {
			allow, deny = b.Network.AllowOut, b.Network.DenyOut
		}
		req.Network = networkSpec(b.AllowInternetAccess, allow, deny)
	}
	if b.Network != nil && b.Network.AllowPublicTraffic != nil && *b.Network.AllowPublicTraffic {
		req.PublicPorts = true
	}
	sb, err := h.svc.Create(r.Context(), c, req)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) && req.Template != "" {
			err = errdefs.NotFound("template %q (space template %q) not found on this server; build it with `space template build %s`", b.TemplateID, req.Template, req.Template)
		}
		h.writeError(w, r, err)
		return
	}
	h.metrics.track(sb.ID)
	writeJSON(w, http.StatusCreated, h.sandboxJSON(sb))
}

// live loads a sandbox the caller owns that has not stopped; a stopped one
// is not found, as in E2B.
func (h *Handler) live(r *http.Request, c sandbox.Caller) (store.Sandbox, error) {
	id := spaceID(r.PathValue("id"))
	sb, err := h.svc.Get(r.Context(), c, id)
	if err != nil {
		return sb, err
	}
	if sb.State == sandbox.StateStopped || sb.State == sandbox.StateStopping {
		return sb, errdefs.NotFound("sandbox %q not found", r.PathValue("id"))
	}
	return sb, nil
}

func (h *Handler) getInfo(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	sb, err := h.live(r, c)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	d := h.detailJSON(sb, true)
	if spec, _, err := h.svc.Network(r.Context(), c, sb.ID); err == nil {
		allowed := len(spec.Allow) > 0
		d.AllowInternetAccess = &allowed
		if allowed || len(spec.Deny) > 0 {
			d.Network = &networkJSON{AllowOut: spec.Allow, DenyOut: spec.Deny}
		}
	}
	writeJSON(w, http.StatusOK, d)
}

func (h *Handler) kill(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	sb, err := h.live(r, c)
	if err == nil {
		err = h.svc.Kill(r.Context(), c, sb.ID)
	}
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	h.forget(sb.ID)
	w.WriteHeader(http.StatusNoContent)
}

// forget drops what the facade keeps in memory for a killed sandbox (its
// code contexts and polling watchers). Sandboxes that end otherwise
// (timeout) leave a few bytes of contexts until the server restarts; their
// watchers go once nobody polled them for watcherIdle.
func (h *Handler) forget(id string) {
	h.interpState.mu.Lock()
	delete(h.interpState.sandboxes, id)
	h.interpState.mu.Unlock()
	h.watchers.forget(id)
	h.metrics.forget(id)
}

type timeoutBody struct {
	Timeout *int  `json:"timeout"`
	Memory  *bool `json:"memory"`
}

// connect returns a running sandbox (200) or resumes a paused one (201).
func (h *Handler) connect(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	var b timeoutBody
	if err := decodeJSON(r, &b); err != nil {
		h.writeError(w, r, err)
		return
	}
	sb, err := h.live(r, c)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	status := http.StatusOK
	if sb.State == sandbox.StatePaused {
		if sb, err = h.svc.Resume(r.Context(), c, sb.ID); err != nil {
			h.writeError(w, r, err)
			return
		}
		status = http.StatusCreated
	}
	// E2B only ever extends a sandbox's life on connect: a timeout that
	// ends earlier than the current end time changes nothing (the SDK
	// sends 300 s by default, which cut an hour-long sandbox to 5 minutes).
	if b.Timeout != nil && *b.Timeout > 0 && extends(sb, *b.Timeout, time.Now()) {
		if sb, err = h.svc.SetTimeout(r.Context(), c, sb.ID, *b.Timeout); err != nil {
			h.writeError(w, r, err)
			return
		}
	}
	h.metrics.track(sb.ID)
	writeJSON(w, status, h.sandboxJSON(sb))
}

// extends reports whether a timeout of timeoutS from now ends later than
// sb's current end time (a sandbox without one is not extended: it does
// not expire).
func extends(sb store.Sandbox, timeoutS int, now time.Time) bool {
	if sb.ExpiresAt.IsZero() {
		return false
	}
	return now.Add(time.Duration(timeoutS) * time.Second).After(sb.ExpiresAt)
}

func (h *Handler) setTimeout(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	var b timeoutBody
	if err := decodeJSON(r, &b); err != nil {
		h.writeError(w, r, err)
		return
	}
	if b.Timeout == nil {
		h.writeError(w, r, errdefs.InvalidArgument("timeout: required (seconds)"))
		return
	}
	sb, err := h.live(r, c)
	if err == nil {
		_, err = h.svc.SetTimeout(r.Context(), c, sb.ID, *b.Timeout)
	}
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// refresh (POST /sandboxes/{id}/refreshes, {"duration": s}) extends the
// timeout like setTimeout.
func (h *Handler) refresh(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	var b struct {
		Duration int `json:"duration"`
	}
	if err := decodeJSON(r, &b); err != nil {
		h.writeError(w, r, err)
		return
	}
	if b.Duration <= 0 {
		b.Duration = 60
	}
	sb, err := h.live(r, c)
	if err == nil {
		_, err = h.svc.SetTimeout(r.Context(), c, sb.ID, b.Duration)
	}
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *Handler) pause(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	var b timeoutBody
	if err := decodeJSON(r, &b); err != nil {
		h.writeError(w, r, err)
		return
	}
	sb, err := h.live(r, c)
	if err == nil {
		if b.Memory != nil && !*b.Memory {
			// keepMemory: false: the files only; the resume boots
			// fresh from them.
			_, err = h.svc.PauseFiles(r.Context(), c, sb.ID)
		} else {
			_, err = h.svc.Pause(r.Context(), c, sb.ID)
		}
	}
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// listQuery is GET /v2/sandboxes's filter.
type listQuery struct {
	states       []string
	metadata     map[string]string
	startedAfter time.Time
	template     string
	desc         bool
	limit        int
	next         string
}

func parseListQuery(q url.Values) (listQuery, error) {
	lq := listQuery{limit: 100, next: q.Get("nextToken")}
	for _, v := range q["state"] {
		for _, s := range strings.Split(v, ",") {
			switch strings.TrimSpace(s) {
			case "running":
				lq.states = append(lq.states, sandbox.StateRunning, sandbox.StateCreating)
			case "paused":
				lq.states = append(lq.states, sandbox.StatePaused)
			case "":
			default:
				return lq, errdefs.InvalidArgument("state: running or paused, got %q", s)
			}
		}
	}
	if len(lq.states) == 0 {
		lq.states = []string{sandbox.StateRunning, sandbox.StateCreating, sandbox.StatePaused}
	}
	// The SDK encodes metadata three times: the query value is a form
	// string whose keys and values are URL-encoded once more.
	if m := q.Get("metadata"); m != "" {
		vals, err := url.ParseQuery(m)
		if err != nil {
			return lq, errdefs.InvalidArgument("metadata: %v", err)
		}
		lq.metadata = map[string]string{}
		for k, vs := range vals {
			key, err1 := url.QueryUnescape(k)
			val, err2 := url.QueryUnescape(vs[0])
			if err1 != nil || err2 != nil {
				return lq, errdefs.InvalidArgument("metadata: bad encoding")
			}
			lq.metadata[key] = val
		}
	}
	if s := q.Get("startedAfter"); s != "" {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return lq, errdefs.InvalidArgument("startedAfter: %v", err)
		}
		lq.startedAfter = t
	}
	lq.template = q.Get("template")
	switch q.Get("order") {
	case "", "desc": // E2B's default: newest first
		lq.desc = true
	case "asc":
	default:
		return lq, errdefs.InvalidArgument("order: asc or desc")
	}
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > store.MaxListLimit {
			return lq, errdefs.InvalidArgument("limit: 1 to %d", store.MaxListLimit)
		}
		lq.limit = n
	}
	return lq, nil
}

// list serves GET /v2/sandboxes: one page of the caller's sandboxes,
// newest first unless order=asc, with X-Next-Token carrying the cursor.
// Every filter (state, metadata, startedAfter, template) and the order
// apply in the store, across the whole result set, so pages of a filtered
// list are full and do not overlap.
func (h *Handler) list(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	lq, err := parseListQuery(r.URL.Query())
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	o := sandbox.ListOptions{States: lq.states, Metadata: lq.metadata, Limit: lq.limit, Cursor: lq.next,
		CreatedFrom: lq.startedAfter, Newest: lq.desc}
	if lq.template != "" {
		o.Templates = []string{lq.template}
		if t, ok := templateAliases[lq.template]; ok && t != lq.template {
			o.Templates = append(o.Templates, t)
		}
	}
	sbs, next, err := h.svc.List(r.Context(), c, o)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	out := []detailJSON{}
	for _, sb := range sbs {
		out = append(out, h.detailJSON(sb, false))
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	writeJSON(w, http.StatusOK, out)
}

// listV1 serves the deprecated GET /sandboxes: running sandboxes.
func (h *Handler) listV1(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	q := r.URL.Query()
	if q.Get("state") == "" {
		q.Set("state", "running")
	}
	r.URL.RawQuery = q.Encode()
	h.list(w, r, c)
}

type snapshotJSON struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func snapJSON(sn store.Snapshot) snapshotJSON {
	s := snapshotJSON{SnapshotID: sn.ID, Names: []string{}}
	if sn.Name != "" {
		s.Names = append(s.Names, sn.Name)
	}
	return s
}

func (h *Handler) createSnapshot(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	var b struct {
		Name string `json:"name"`
	}
	if err := decodeJSON(r, &b); err != nil {
		h.writeError(w, r, err)
		return
	}
	sb, err := h.live(r, c)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	sn, err := h.svc.Snapshot(r.Context(), c, sb.ID, sandbox.SnapshotRequest{Kind: sandbox.KindCheckpoint, Name: b.Name})
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, snapJSON(sn))
}

// listSnapshots serves GET /snapshots: the snapshots of one sandbox
// (sandboxID) or of every live sandbox of the caller's team; automatic
// history snapshots are left out unless named.
func (h *Handler) listSnapshots(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	q := r.URL.Query()
	var ids []string
	if id := q.Get("sandboxID"); id != "" {
		ids = []string{spaceID(id)}
	} else {
		for cursor := ""; ; {
			sbs, next, err := h.svc.List(r.Context(), c, sandbox.ListOptions{Limit: store.MaxListLimit, Cursor: cursor})
			if err != nil {
				h.writeError(w, r, err)
				return
			}
			for _, sb := range sbs {
				ids = append(ids, sb.ID)
			}
			if cursor = next; cursor == "" {
				break
			}
		}
	}
	out := []snapshotJSON{}
	for _, id := range ids {
		snaps, err := h.svc.Snapshots(r.Context(), c, id)
		if err != nil {
			if errors.Is(err, errdefs.ErrNotFound) {
				continue
			}
			h.writeError(w, r, err)
			return
		}
		for _, sn := range snaps {
			if sn.Status != store.SnapshotReady || sn.Kind != sandbox.KindCheckpoint || (sn.Automatic && sn.Name == "") {
				continue
			}
			if name := q.Get("name"); name != "" && sn.Name != name {
				continue
			}
			out = append(out, snapJSON(sn))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *Handler) deleteSnapshot(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	id := r.PathValue("id")
	if !strings.HasPrefix(id, "snap-") {
		h.writeError(w, r, errdefs.NotSupported("space's E2B API manages snapshots only, not templates (%q)", id))
		return
	}
	if err := h.svc.DeleteSnapshot(r.Context(), c, id); err != nil {
		h.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// templateAlias serves GET /templates/aliases/{alias} (Template.exists):
// 200 {templateID, public} for a template this server has (E2B's aliases
// or a space template name), a 404 otherwise. Space's templates serve
// every team, so each is public. A snapshot id is not an alias.
func (h *Handler) templateAlias(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	alias := r.PathValue("alias")
	name := alias
	if t, ok := templateAliases[alias]; ok && alias != "" {
		name = t
	}
	// A template being built, or whose build failed, exists too: its name
	// is taken (E2B's alias exists from the build's start).
	if _, err := h.cfg.Store.GetTemplate(r.Context(), name); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			err = errdefs.NotFound("template alias %q not found", alias)
		}
		h.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"templateID": alias, "public": true})
}

func (h *Handler) fork(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	var b struct {
		Count   int  `json:"count"`
		Timeout *int `json:"timeout"`
	}
	if err := decodeJSON(r, &b); err != nil {
		h.writeError(w, r, err)
		return
	}
	sb, err := h.live(r, c)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	children, err := h.svc.Fork(r.Context(), c, sb.ID, b.Count, "")
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	out := make([]map[string]any, 0, len(children))
	for _, ch := range children {
		if b.Timeout != nil && *b.Timeout > 0 {
			if upd, err := h.svc.SetTimeout(r.Context(), c, ch.ID, *b.Timeout); err == nil {
				ch = upd
			}
		}
		out = append(out, map[string]any{"sandbox": h.sandboxJSON(ch)})
	}
	writeJSON(w, http.StatusCreated, out)
}

func (h *Handler) updateNetwork(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	var b struct {
		AllowOut            []string `json:"allowOut"`
		DenyOut             []string `json:"denyOut"`
		AllowInternetAccess *bool    `json:"allow_internet_access"`
	}
	if err := decodeJSON(r, &b); err != nil {
		h.writeError(w, r, err)
		return
	}
	sb, err := h.live(r, c)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	spec := networkSpec(b.AllowInternetAccess, b.AllowOut, b.DenyOut)
	if spec == nil {
		spec = &sandbox.NetworkSpec{} // an empty allow list: nothing leaves
	}
	if _, err := h.svc.SetNetwork(r.Context(), c, sb.ID, *spec); err != nil {
		h.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// decodeJSON reads an optional JSON body leniently: the SDKs add fields
// space does not know (ignored), and an empty body is an empty object.
func decodeJSON(r *http.Request, v any) error {
	b, err := io.ReadAll(io.LimitReader(r.Body, 1<<20+1))
	if err != nil {
		return errdefs.InvalidArgument("request body: %v", err)
	}
	if len(b) > 1<<20 {
		return errdefs.Newf(errdefs.ErrTooLarge, "request body larger than 1 MiB")
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return errdefs.InvalidArgument("request body: %v", err)
	}
	return nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// writeJSONError writes E2B's error body {code: <status>, message}.
func writeJSONError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"code": status, "message": msg})
}

// writeError maps an error class to its status (errdefs, one place) and
// writes E2B's error body.
func (h *Handler) writeError(w http.ResponseWriter, r *http.Request, err error) {
	_, status := errdefs.Classify(err)
	msg := err.Error()
	if status == http.StatusInternalServerError {
		h.log.Error("internal error", "method", r.Method, "path", r.URL.Path, "err", err)
		msg = "internal error"
	}
	if errors.Is(err, errdefs.ErrRateLimited) {
		w.Header().Set("Retry-After", "1")
	}
	writeJSONError(w, status, fmt.Sprint(msg))
}

// startupEnv reports whether env sets a variable a Python kernel reads
// only while it starts or imports its libraries: the interpreter's own
// (PYTHONPATH, PYTHONHASHSEED, ...), the dynamic loader's, the locale and
// time zone, the thread pools of numpy's BLAS, matplotlib's config dir, the
// home and temp dirs. A prestarted kernel takes the owner's env after all
// that, so it would not honour them: such a create has it killed, and the
// first cell starts a kernel of its own, as in a cold sandbox.
// MPLBACKEND is not one: the kernel switches the backend when it gets it.
func startupEnv(env map[string]string) bool {
	for k := range env {
		switch k {
		case "TZ", "LANG", "LANGUAGE", "HOME", "TMPDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "MPLCONFIGDIR":
			return true
		}
		for _, prefix := range startupEnvPrefixes {
			if strings.HasPrefix(k, prefix) {
				return true
			}
		}
	}
	return false
}

var startupEnvPrefixes = []string{"PYTHON", "LD_", "LC_", "OMP_", "OPENBLAS_", "MKL_", "NUMEXPR_", "GOTO_"}
