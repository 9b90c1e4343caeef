package e2b

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/subtle"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandbox"
)

// The code interpreter (port 49999 of @e2b/code-interpreter): a kernel
// process per code context, started in the sandbox through the service
// (python3 or node running the drivers in kernel/), fed one JSON request
// per execution on stdin; its messages come back through the process's
// event log and are passed on as NDJSON.

//go:embed kernel/python.py
var pythonKernel []byte

//go:embed kernel/javascript.js
var javascriptKernel []byte

//go:embed kernel/bash.py
var bashKernel []byte

// kernelDir is where the kernels are written in a sandbox.
const kernelDir = "/tmp/.space-e2b"

// msgMark starts every kernel message line; text before it is raw output.
const msgMark = '\x1e'

type codeContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`

	mu   sync.Mutex // one execution at a time
	pid  int
	seq  uint64 // next event to read; 0: not known yet (a kernel found by its tag)
	part []byte // an unfinished output line
}

// The contexts of a sandbox live in its agent: each kernel process carries
// a tag naming its context (kernelTag), so a restarted server, and the
// children of a fork (whose agents hold copies of the kernels), find them.
// The interpreter keeps what it found per sandbox, with what only it knows
// (the read position in each kernel's output, the execution lock).
type interpreter struct {
	mu        sync.Mutex
	sandboxes map[string]map[string]*codeContext // sandbox id → context id → context
}

// kernelTagPrefix starts a kernel's process tag; the rest is the context
// as JSON.
const kernelTagPrefix = reservedTagPrefix + "e2b-context:"

func kernelTag(c *codeContext) string {
	b, _ := json.Marshal(c)
	return kernelTagPrefix + string(b)
}

// contextOfTag is the context a kernel's tag names.
func contextOfTag(tag string) (*codeContext, bool) {
	rest, ok := strings.CutPrefix(tag, kernelTagPrefix)
	if !ok {
		return nil, false
	}
	var c codeContext
	if json.Unmarshal([]byte(rest), &c) != nil || c.ID == "" {
		return nil, false
	}
	if _, err := normLanguage(c.Language); err != nil {
		return nil, false
	}
	return &c, true
}

// contexts returns the sandbox's contexts, found from its running kernels
// the first time (the caller holds h.interpState.mu to use the map).
func (h *Handler) contexts(ctx context.Context, t envdTarget) (map[string]*codeContext, error) {
	h.interpState.mu.Lock()
	m := h.interpState.sandboxes[t.id]
	h.interpState.mu.Unlock()
	if m != nil {
		return m, nil
	}
	procs, err := h.svc.Processes(ctx, t.caller, t.id)
	if err != nil {
		return nil, err
	}
	found := map[string]*codeContext{}
	started := map[string]time.Time{}
	for _, pr := range procs {
		c, ok := contextOfTag(pr.Tag)
		if !ok || !pr.Running {
			continue
		}
		if at, seen := started[c.ID]; seen && at.After(pr.StartedAt) {
			continue
		}
		c.pid = pr.PID
		found[c.ID], started[c.ID] = c, pr.StartedAt
	}
	h.interpState.mu.Lock()
	defer h.interpState.mu.Unlock()
	if m := h.interpState.sandboxes[t.id]; m != nil {
		return m, nil // found by a concurrent request first
	}
	h.interpState.sandboxes[t.id] = found
	return found, nil
}

func (h *Handler) interpreterMux() http.Handler {
	m := http.NewServeMux()
	m.HandleFunc("POST /execute", h.execute)
	m.HandleFunc("GET /contexts", h.listContexts)
	m.HandleFunc("POST /contexts", h.createContext)
	m.HandleFunc("DELETE /contexts/{cid}", h.removeContext)
	m.HandleFunc("POST /contexts/{cid}/restart", h.restartContext)
	m.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSONError(w, http.StatusNotFound, "no route for "+r.Method+" "+r.URL.Path)
	})
	return m
}

// serveInterpreter authenticates a port-49999 request: the envd access
// token (sent on /execute) or the traffic access token (sent on every
// call when the create answer had one).
func (h *Handler) serveInterpreter(w http.ResponseWriter, r *http.Request, id string) {
	sb, err := h.svc.Get(r.Context(), sandbox.Caller{Admin: true}, id)
	if err != nil || sb.State != sandbox.StateRunning {
		writeJSONError(w, http.StatusBadGateway, "sandbox "+e2bID(id)+" is not running")
		return
	}
	if !h.trafficAllowed(r, id) && r.URL.Path != "/health" {
		writeJSONError(w, http.StatusUnauthorized, "unauthorized: missing or wrong access token")
		return
	}
	ctx := context.WithValue(r.Context(), targetKey{}, envdTarget{id: id, caller: sandbox.Caller{Team: sb.Team}})
	h.interp.ServeHTTP(w, r.WithContext(ctx))
}

// trafficAllowed reports whether r carries sandbox id's envd access token
// or its traffic access token.
func (h *Handler) trafficAllowed(r *http.Request, id string) bool {
	return subtle.ConstantTimeCompare([]byte(r.Header.Get("X-Access-Token")), []byte(h.accessToken(id))) == 1 ||
		subtle.ConstantTimeCompare([]byte(r.Header.Get("E2B-Traffic-Access-Token")), []byte(h.trafficToken(id))) == 1
}

func normLanguage(l string) (string, error) {
	switch strings.ToLower(l) {
	case "", "python", "python3":
		return "python", nil
	case "javascript", "js", "node", "typescript", "ts":
		return "javascript", nil
	case "bash", "sh", "shell":
		return "bash", nil
	}
	return "", errdefs.InvalidArgument("language %q is not supported (python, javascript, bash)", l)
}

// contextFor returns the context with id cid, or the default context of
// language when cid is empty (started on first use).
func (h *Handler) contextFor(ctx context.Context, t envdTarget, cid, language string) (*codeContext, error) {
	m, err := h.contexts(ctx, t)
	if err != nil {
		return nil, err
	}
	h.interpState.mu.Lock()
	defer h.interpState.mu.Unlock()
	if cid != "" {
		c := m[cid]
		if c == nil {
			return nil, errdefs.NotFound("context %s not found", cid)
		}
		return c, nil
	}
	lang, err := normLanguage(language)
	if err != nil {
		return nil, err
	}
	if c := m["default-"+lang]; c != nil {
		return c, nil
	}
	c := defaultContext(lang)
	m[c.ID] = c
	return c, nil
}

// defaultContext is the context of language's default kernel.
func defaultContext(lang string) *codeContext {
	return &codeContext{ID: "default-" + lang, Language: lang, Cwd: "/home/user"}
}

// preloadModules are what a prestarted Python kernel imports before it
// is ready: what data-analysis code imports first (1.5-2.5 s in a
// sandbox here), as the E2B code interpreter's Jupyter kernel has them.
const preloadModules = "numpy,pandas,matplotlib.pyplot"

// kernelReady is the message a kernel prints once its preloads are done.
const kernelReady = "\x1e{\"type\": \"ready\"}\n"

// KernelPrestart is the default Python context's kernel for warm pools of
// InterpreterTemplate: started before the claim with preloadModules
// loaded, found by its tag on the first execution like a kernel a
// previous server started, and given the sandbox's env at the claim (the
// facade's creates keep it: CreateRequest.KeepPrestarted).
func KernelPrestart() *sandbox.Prestart {
	c := defaultContext("python")
	file, src, argv := kernelOf(c.Language)
	return &sandbox.Prestart{
		Files:   map[string][]byte{file: src},
		Discard: []string{kernelDir},
		Start:   agentproto.StartRequest{Cmd: append(argv, "--preload", preloadModules), Cwd: c.Cwd, Tag: kernelTag(c)},
		Ready:   []byte(kernelReady),
	}
}

// kernelOf is where language's kernel driver is written in a sandbox, its
// source, and the command that runs it.
func kernelOf(language string) (file string, src []byte, argv []string) {
	switch language {
	case "javascript":
		return kernelDir + "/javascript.js", javascriptKernel, []string{"node", kernelDir + "/javascript.js"}
	case "bash":
		return kernelDir + "/bash.py", bashKernel, []string{"python3", "-u", kernelDir + "/bash.py"}
	}
	return kernelDir + "/python.py", pythonKernel, []string{"python3", "-u", kernelDir + "/python.py"}
}

// start runs the context's kernel (c.mu held).
func (h *Handler) startKernel(ctx context.Context, t envdTarget, c *codeContext) error {
	file, src, argv := kernelOf(c.Language)
	if _, err := h.svc.WriteFile(ctx, t.caller, t.id, file, bytes.NewReader(src)); err != nil {
		return err
	}
	// A copy of the kernel (in a fork's child, a sandbox made from a
	// checkpoint) gets the copy's env at its identity, as later cells'
	// processes do.
	pid, err := h.svc.Exec(ctx, t.caller, t.id, sandbox.ExecRequest{Cmd: argv, Cwd: c.Cwd, OpenStdin: true, Background: true, Tag: kernelTag(c), FollowIdentity: true})
	if err != nil {
		return err
	}
	c.pid, c.seq, c.part = pid, 1, nil
	return nil
}

func (h *Handler) stopKernel(ctx context.Context, t envdTarget, c *codeContext) {
	if c.pid != 0 {
		_ = h.svc.Signal(ctx, t.caller, t.id, c.pid, "SIGKILL")
	}
	c.pid = 0
}

type executeBody struct {
	Code      string            `json:"code"`
	ContextID string            `json:"context_id"`
	Language  string            `json:"language"`
	EnvVars   map[string]string `json:"env_vars"`
}

// execute serves POST /execute: the kernel's messages as NDJSON, ending
// with end_of_execution.
func (h *Handler) execute(w http.ResponseWriter, r *http.Request) {
	t := targetOf(r.Context())
	var b executeBody
	if err := decodeJSON(r, &b); err != nil {
		h.writeError(w, r, err)
		return
	}
	if b.ContextID != "" && b.Language != "" {
		h.writeError(w, r, errdefs.InvalidArgument("give a context_id or a language, not both"))
		return
	}
	c, err := h.contextFor(r.Context(), t, b.ContextID, b.Language)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ctx := r.Context()
	if c.pid == 0 {
		if err := h.startKernel(ctx, t, c); err != nil {
			h.writeError(w, r, err)
			return
		}
	} else if c.seq == 0 {
		// A kernel found by its tag: what it printed before is not this
		// execution's; read from the end of its log.
		if c.seq, err = h.logEnd(ctx, t, c.pid); err != nil {
			h.writeError(w, r, err)
			return
		}
		c.part = nil
	}
	line, _ := json.Marshal(map[string]any{"code": b.Code, "env": b.EnvVars})
	if err := h.svc.Stdin(ctx, t.caller, t.id, c.pid, bytes.NewReader(append(line, '\n')), false); err != nil {
		c.pid = 0 // the kernel is gone: start a new one next time
		h.writeError(w, r, err)
		return
	}
	evs, err := h.svc.Events(ctx, t.caller, t.id, c.pid, c.seq, true)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	send := func(msg json.RawMessage) {
		w.Write(append(msg, '\n'))
		_ = rc.Flush()
	}
	sendText := func(kind, text string) {
		if text == "" {
			return
		}
		m, _ := json.Marshal(map[string]string{"type": kind, "text": text, "timestamp": time.Now().UTC().Format(time.RFC3339Nano)})
		send(m)
	}
	done := c.read(evs, func(kind string, text string, msg json.RawMessage) {
		if msg != nil {
			send(msg)
		} else {
			sendText(kind, text)
		}
	})
	evs.Close()
	if !done && ctx.Err() == nil {
		h.log.Warn("code interpreter: output ended before the execution did", "sandbox", t.id, "context", c.ID)
	}
	if !done && ctx.Err() != nil && c.pid != 0 {
		// The client stopped waiting (its timeoutMs) with the cell still
		// running: interrupt it, as Jupyter does, so that the context
		// answers the next execution instead of staying busy for good.
		h.interrupt(ctx, t, c)
	}
}

// read passes one execution's output on to out (text with kind "stdout"
// or "stderr", or a kernel message) until its end_of_execution or the
// kernel's exit (then true), or until evs fails (the client went away:
// false). c's read position follows.
func (c *codeContext) read(evs sandbox.EventStream, out func(kind, text string, msg json.RawMessage)) bool {
	for {
		ev, err := evs.Next()
		if err != nil {
			return false
		}
		c.seq = ev.Seq + 1
		switch ev.Type {
		case agentproto.EventStderr:
			out("stderr", string(ev.Data), nil)
		case agentproto.EventStdout:
			c.part = append(c.part, ev.Data...)
			for {
				i := bytes.IndexByte(c.part, '\n')
				if i < 0 {
					break
				}
				l := c.part[:i]
				c.part = c.part[i+1:]
				raw, msg, found := bytes.Cut(l, []byte{msgMark})
				if !found {
					out("stdout", string(l)+"\n", nil)
					continue
				}
				out("stdout", string(raw), nil)
				if !json.Valid(msg) {
					continue
				}
				var head struct {
					Type string `json:"type"`
				}
				_ = json.Unmarshal(msg, &head)
				if head.Type == "ready" {
					continue // a prestarted kernel's, before any execution
				}
				out("", "", append(json.RawMessage(nil), msg...))
				if head.Type == "end_of_execution" {
					return true
				}
			}
		case agentproto.EventExit:
			// The kernel died (os._exit, OOM, killed): report it; the next
			// execution starts a fresh kernel.
			c.pid = 0
			out("stdout", string(c.part), nil)
			c.part = nil
			m, _ := json.Marshal(map[string]string{"type": "error", "name": "KernelDied", "value": "the kernel exited; its state is lost", "traceback": ""})
			out("", "", m)
			out("", "", json.RawMessage(`{"type":"end_of_execution"}`))
			return true
		}
	}
}

// interruptWait is how long an interrupted cell has to end before its
// kernel is killed.
const interruptWait = 5 * time.Second

// interrupt sends SIGINT to a kernel whose execution nobody waits for any
// more (Python raises KeyboardInterrupt in the cell, Node breaks the
// script) and reads the rest of that execution, so the next one starts at
// its own output. A cell that does not end within interruptWait (it
// ignores SIGINT, or waits on a promise forever) costs the kernel: it is
// killed and the next execution starts a fresh one. Called with c.mu held.
func (h *Handler) interrupt(reqCtx context.Context, t envdTarget, c *codeContext) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(reqCtx), interruptWait)
	defer cancel()
	log := h.log.With("sandbox", t.id, "context", c.ID, "pid", c.pid)
	if err := h.svc.Signal(ctx, t.caller, t.id, c.pid, "SIGINT"); err != nil {
		log.Warn("code interpreter: interrupt", "err", err)
	}
	if evs, err := h.svc.Events(ctx, t.caller, t.id, c.pid, c.seq, true); err == nil {
		done := c.read(evs, func(string, string, json.RawMessage) {})
		evs.Close()
		if done {
			log.Info("code interpreter: execution interrupted after its client left")
			return
		}
	}
	log.Warn("code interpreter: the interrupted execution did not end; killing its kernel")
	_ = h.svc.Signal(context.WithoutCancel(reqCtx), t.caller, t.id, c.pid, "SIGKILL")
	c.pid, c.part = 0, nil
}

// logEnd is the seq after the last event a process's log holds.
func (h *Handler) logEnd(ctx context.Context, t envdTarget, pid int) (uint64, error) {
	evs, err := h.svc.Events(ctx, t.caller, t.id, pid, 1, false)
	if err != nil {
		return 0, err
	}
	defer evs.Close()
	next := uint64(1)
	for {
		ev, err := evs.Next()
		if errors.Is(err, io.EOF) {
			return next, nil
		}
		if err != nil {
			return 0, err
		}
		next = ev.Seq + 1
		evs.Recycle(ev.Data)
	}
}

func (h *Handler) listContexts(w http.ResponseWriter, r *http.Request) {
	t := targetOf(r.Context())
	m, err := h.contexts(r.Context(), t)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	h.interpState.mu.Lock()
	out := []map[string]string{}
	for _, c := range m {
		out = append(out, map[string]string{"id": c.ID, "language": c.Language, "cwd": c.Cwd})
	}
	h.interpState.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
}

func (h *Handler) createContext(w http.ResponseWriter, r *http.Request) {
	t := targetOf(r.Context())
	var b struct {
		Language string `json:"language"`
		Cwd      string `json:"cwd"`
	}
	if err := decodeJSON(r, &b); err != nil {
		h.writeError(w, r, err)
		return
	}
	lang, err := normLanguage(b.Language)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	if b.Cwd == "" {
		b.Cwd = "/home/user"
	}
	m, err := h.contexts(r.Context(), t)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	id := make([]byte, 8)
	rand.Read(id)
	c := &codeContext{ID: hex.EncodeToString(id), Language: lang, Cwd: b.Cwd}
	c.mu.Lock()
	err = h.startKernel(r.Context(), t, c)
	c.mu.Unlock()
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	h.interpState.mu.Lock()
	m[c.ID] = c
	h.interpState.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]string{"id": c.ID, "language": c.Language, "cwd": c.Cwd})
}

func (h *Handler) removeContext(w http.ResponseWriter, r *http.Request) {
	t := targetOf(r.Context())
	cid := r.PathValue("cid")
	m, err := h.contexts(r.Context(), t)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	h.interpState.mu.Lock()
	c := m[cid]
	delete(m, cid)
	h.interpState.mu.Unlock()
	if c == nil {
		writeJSONError(w, http.StatusNotFound, "context "+cid+" not found")
		return
	}
	h.stopKernel(r.Context(), t, c)
	w.WriteHeader(http.StatusNoContent)
}

// restartContext replaces the context's kernel with a fresh one (its state
// is lost, its id stays).
func (h *Handler) restartContext(w http.ResponseWriter, r *http.Request) {
	t := targetOf(r.Context())
	c, err := h.contextFor(r.Context(), t, r.PathValue("cid"), "")
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	h.stopKernel(r.Context(), t, c)
	if err := h.startKernel(r.Context(), t, c); err != nil {
		h.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
