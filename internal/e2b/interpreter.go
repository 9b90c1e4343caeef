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
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandbox"
)

// The code interpreter (port 49999 of @e2b/code-interpreter): a kernel
// process per code context, started in the sandbox through the service
// (python3 or node running the drivers in kernel/), fed one JSON request
// per execution on stdin; its messages come back through the process's
// event log and are passed on as NDJSON. Each request carries a random id
// that the kernel repeats in the execution's number_of_executions: the
// output read up to it is another execution's (one that ran while a fork
// was taken, or whose request arrived but whose reader failed), and is
// not passed on.

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

// Bounds on what is kept of an unfinished kernel output line (vars for the
// tests). Raw text (a subprocess writing without newlines, `cat
// /dev/zero`) is passed on in pieces of about maxRawLine; a message line
// may be big (a PNG result is base64 in it), but one longer than
// maxMessageLine is dropped up to its newline, so a kernel cannot make the
// server hold its output without bound.
var (
	maxRawLine     = 1 << 20
	maxMessageLine = 64 << 20
)

type codeContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`

	mu   sync.Mutex // one execution at a time; guards the fields below
	pid  int
	seq  uint64 // next event to read; 0: not known yet (a kernel found by its tag)
	part []byte // kernel stdout not passed on yet: an unfinished line, or what followed an execution's end
	drop bool   // dropping an oversized message line up to its newline
	// exec is the id of the execution being read; started once its
	// number_of_executions was read (what came before is not its output).
	exec    string
	started bool
	// removed: DELETE /contexts took it out, and no kernel is started for
	// it any more (atomic: set before its removal waits for c.mu).
	removed atomic.Bool
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
// call when the create answer had one), /health included. As on envd's
// port the token is checked before the sandbox is looked up, so a caller
// without one learns nothing about which ids exist.
func (h *Handler) serveInterpreter(w http.ResponseWriter, r *http.Request, id string) {
	if !h.trafficAllowed(r, id) {
		writeJSONError(w, http.StatusUnauthorized, "unauthorized: missing or wrong access token")
		return
	}
	sb, err := h.svc.Get(r.Context(), sandbox.Caller{Admin: true}, id)
	if err != nil || sb.State != sandbox.StateRunning {
		writeJSONError(w, http.StatusBadGateway, "sandbox "+e2bID(id)+" is not running")
		return
	}
	if r.URL.Path != "/health" {
		// The team's request rate, as on envd's port.
		if err := h.svc.AllowRequest(r.Context(), sandbox.Caller{Team: sb.Team}); err != nil {
			h.writeError(w, r, err)
			return
		}
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
		Start:   agentproto.StartRequest{Cmd: append(argv, "--preload", preloadModules), Cwd: c.Cwd, User: kernelUser, Tag: kernelTag(c)},
		Ready:   []byte(kernelReady),
	}
}

// kernelUser runs the kernels: root, as E2B's Jupyter kernels run
// (a context's cwd may be /root; `!apt-get install` works). Root inside
// the sandbox changes nothing at the isolation boundary (docs/SECURITY.md).
const kernelUser = "root"

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
	pid, err := h.svc.Exec(ctx, t.caller, t.id, sandbox.ExecRequest{Cmd: argv, Cwd: c.Cwd, User: kernelUser, OpenStdin: true, Background: true, Tag: kernelTag(c), FollowIdentity: true})
	if err != nil {
		return err
	}
	c.pid, c.seq = pid, 1
	c.resetOutput()
	return nil
}

// stopKernel kills the context's kernel (c.mu held).
func (h *Handler) stopKernel(ctx context.Context, t envdTarget, c *codeContext) {
	if c.pid != 0 {
		_ = h.svc.Signal(ctx, t.caller, t.id, c.pid, "SIGKILL")
	}
	c.pid = 0
}

// resetOutput forgets what was read of a kernel's output (a new kernel, or
// one found by its tag whose log is read from its end).
func (c *codeContext) resetOutput() {
	c.part, c.drop, c.started = nil, false, false
}

// kernelStdinFailed handles a request that could not be written to the
// kernel's stdin while its client still waits: a kernel that is gone (its
// process exited or was pruned) or that closed its stdin (it can take no
// more requests) is given up, and the next execution starts a fresh one.
// When the sandbox cannot say (its agent unreachable for a moment, the
// sandbox pausing), the kernel and its state are kept. Called with c.mu
// held.
func (h *Handler) kernelStdinFailed(ctx context.Context, t envdTarget, c *codeContext, err error) {
	procs, perr := h.svc.Processes(ctx, t.caller, t.id)
	if perr != nil {
		h.log.Warn("code interpreter: a request did not reach the kernel; keeping it", "sandbox", t.id, "context", c.ID, "pid", c.pid, "err", err)
		return
	}
	for _, pr := range procs {
		if pr.PID == c.pid && pr.Running {
			if errors.Is(err, errdefs.ErrConflict) {
				h.stopKernel(ctx, t, c)
			}
			return
		}
	}
	c.pid = 0
}

// requestLine is an execution's request to a kernel. The leading newline
// ends whatever a request cut short (its client left while it was being
// written) left on the kernel's stdin, so that this one is a line of its
// own.
func requestLine(id, code string, env map[string]string) []byte {
	line, _ := json.Marshal(map[string]any{"id": id, "code": code, "env": env})
	return append(append([]byte{'\n'}, line...), '\n')
}

// newExecID is a request's id: random, so that no earlier execution of a
// kernel (a previous server's included) had it.
func newExecID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// validEnvVars checks an execution's env_vars by the rules the sandbox's
// env follows (internal/sandbox validateEnv): a kernel cannot hold a name
// with '=' or NUL, and an empty one.
func validEnvVars(env map[string]string) error {
	if len(env) > 256 {
		return errdefs.InvalidArgument("env_vars: at most 256 variables")
	}
	for k, v := range env {
		if !envNameRE.MatchString(k) {
			return errdefs.InvalidArgument("env_vars: invalid variable name %q", k)
		}
		if len(v) > 32<<10 || !utf8.ValidString(v) || strings.IndexByte(v, 0) >= 0 {
			return errdefs.InvalidArgument("env_vars: invalid value for %q", k)
		}
	}
	return nil
}

var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

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
	if err := validEnvVars(b.EnvVars); err != nil {
		h.writeError(w, r, err)
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
	if ctx.Err() != nil {
		// The client went away while an earlier execution held the
		// context: nothing was sent, and the kernel is as it was.
		return
	}
	if c.removed.Load() {
		h.writeError(w, r, errdefs.NotFound("context %s was removed", c.ID))
		return
	}
	for attempt := 0; ; attempt++ {
		if c.pid == 0 {
			if err := h.startKernel(ctx, t, c); err != nil {
				h.writeError(w, r, err)
				return
			}
		} else if c.seq == 0 {
			// A kernel found by its tag: what it printed before is not
			// this execution's; read from the end of its log.
			if c.seq, err = h.logEnd(ctx, t, c.pid); err != nil {
				h.writeError(w, r, err)
				return
			}
			c.resetOutput()
		}
		c.exec, c.started = newExecID(), false
		err := h.svc.Stdin(ctx, t.caller, t.id, c.pid, bytes.NewReader(requestLine(c.exec, b.Code, b.EnvVars)), false)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return // the client went away; the kernel is kept
		}
		h.kernelStdinFailed(ctx, t, c, err)
		if c.pid != 0 || attempt > 0 {
			h.writeError(w, r, err)
			return
		}
		// The kernel was gone (killed or exited between cells, so no
		// execution reported it): as Jupyter restarts a dead kernel, the
		// execution runs in a fresh one, without the old one's state.
		h.log.Info("code interpreter: the context's kernel had exited; starting a new one", "sandbox", t.id, "context", c.ID)
	}
	evs, err := h.svc.Events(ctx, t.caller, t.id, c.pid, c.seq, true)
	if err != nil {
		if ctx.Err() != nil {
			// The request reached the kernel but nobody waits for it.
			h.interrupt(ctx, t, c)
			return
		}
		// The execution runs unread; the next one skips its output by
		// its id.
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
		// The kernel's output broke off with the execution unfinished
		// (the sandbox was killed, or its agent is unreachable): an
		// ended body would read as an empty execution, so the
		// connection is dropped and runCode fails (the SDK then tells
		// a killed sandbox apart by envd's /health).
		h.log.Warn("code interpreter: output ended before the execution did", "sandbox", t.id, "context", c.ID)
		dropConnection()
	}
	if !done && ctx.Err() != nil && c.pid != 0 {
		// The client stopped waiting (its timeoutMs) with the cell still
		// running: interrupt it, as Jupyter does, so that the context
		// answers the next execution instead of staying busy for good.
		h.interrupt(ctx, t, c)
	}
}

// read passes execution c.exec's output on to out (text with kind
// "stdout" or "stderr", or a kernel message) until its end_of_execution or
// the kernel's exit (then true), or until evs fails (the client went away:
// false). What comes before the execution's number_of_executions (found
// by its id; a kernel started by an older server sends none, and its first
// number_of_executions is taken) is another execution's and is skipped.
// c's read position follows.
func (c *codeContext) read(evs sandbox.EventStream, out func(kind, text string, msg json.RawMessage)) bool {
	pass := func(kind, text string, msg json.RawMessage) {
		if c.started && (msg != nil || text != "") {
			out(kind, text, msg)
		}
	}
	if len(c.part) > 0 {
		// Lines read with an earlier execution's end.
		rest := c.part
		c.part = nil
		if c.take(rest, pass) {
			return true
		}
	}
	for {
		ev, err := evs.Next()
		if err != nil {
			return false
		}
		c.seq = ev.Seq + 1
		switch ev.Type {
		case agentproto.EventStderr:
			pass("stderr", string(ev.Data), nil)
		case agentproto.EventStdout:
			if c.take(ev.Data, pass) {
				return true
			}
		case agentproto.EventExit:
			// The kernel died (os._exit, OOM, killed): report it, whoever's
			// execution it was in; the next execution starts a fresh kernel.
			c.pid = 0
			if !c.drop {
				raw, _, _ := bytes.Cut(c.part, []byte{msgMark})
				pass("stdout", string(raw), nil)
			}
			c.resetOutput()
			m, _ := json.Marshal(map[string]string{"type": "error", "name": "KernelDied", "value": "the kernel exited; its state is lost", "traceback": ""})
			out("", "", m)
			out("", "", json.RawMessage(`{"type":"end_of_execution"}`))
			return true
		}
	}
}

// take reads kernel stdout: each complete line is raw output or a message
// (after msgMark); it reports whether the execution's end was read, and
// then keeps what followed it in c.part for the next read. An unfinished
// line is kept in c.part within the bounds of maxRawLine and
// maxMessageLine.
func (c *codeContext) take(data []byte, pass func(kind, text string, msg json.RawMessage)) bool {
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			if !c.drop {
				c.part = append(c.part, data...)
				c.bound(pass)
			}
			return false
		}
		l := data[:i]
		data = data[i+1:]
		if c.drop {
			c.drop = false // the end of the dropped line
			continue
		}
		if len(c.part) > 0 {
			l = append(c.part, l...)
			c.part = c.part[:0]
			if cap(c.part) > maxRawLine {
				c.part = nil // not kept after a big message
			}
		}
		if c.line(l, pass) {
			c.part = append([]byte(nil), data...)
			return true
		}
	}
	return false
}

// bound passes on, or drops, the unfinished line in c.part once it is too
// long to keep: raw text beyond maxRawLine is passed on as stdout (up to
// a UTF-8 character's boundary), a message beyond maxMessageLine is
// dropped with the rest of its line.
func (c *codeContext) bound(pass func(kind, text string, msg json.RawMessage)) {
	mark := bytes.IndexByte(c.part, msgMark)
	switch {
	case mark < 0 && len(c.part) > maxRawLine:
		n := runeBoundary(c.part)
		pass("stdout", string(c.part[:n]), nil)
		c.part = append(c.part[:0], c.part[n:]...)
	case mark >= 0 && len(c.part)-mark > maxMessageLine:
		pass("stdout", string(c.part[:mark]), nil)
		c.part, c.drop = nil, true
	}
}

// runeBoundary is the length of b without the start of a UTF-8 character
// its end cuts.
func runeBoundary(b []byte) int {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return i
			}
			break
		}
	}
	return len(b)
}

// line handles one complete line of kernel stdout; it reports whether it
// was the execution's end.
func (c *codeContext) line(l []byte, pass func(kind, text string, msg json.RawMessage)) bool {
	raw, msg, found := bytes.Cut(l, []byte{msgMark})
	if !found {
		pass("stdout", string(l)+"\n", nil)
		return false
	}
	pass("stdout", string(raw), nil)
	if !json.Valid(msg) {
		return false
	}
	var head struct {
		Type      string          `json:"type"`
		ID        *string         `json:"id"`
		Timestamp json.RawMessage `json:"timestamp"`
	}
	if json.Unmarshal(msg, &head) != nil {
		return false
	}
	switch head.Type {
	case "ready": // a prestarted kernel's, before any execution
	case "number_of_executions":
		if !c.started && (head.ID == nil || *head.ID == c.exec) {
			c.started = true
			pass("", "", withoutID(msg))
		}
	case "end_of_execution":
		if c.started {
			pass("", "", append(json.RawMessage(nil), msg...))
			c.started = false
			return true
		}
	case "stdout", "stderr":
		if head.Timestamp == nil {
			msg = stamped(msg)
		}
		pass("", "", append(json.RawMessage(nil), msg...))
	default:
		pass("", "", append(json.RawMessage(nil), msg...))
	}
	return false
}

// withoutID is a kernel's number_of_executions as E2B sends it: the
// request's id is the facade's.
func withoutID(msg []byte) json.RawMessage {
	var m map[string]json.RawMessage
	if json.Unmarshal(msg, &m) != nil {
		return append(json.RawMessage(nil), msg...)
	}
	delete(m, "id")
	b, _ := json.Marshal(m)
	return b
}

// stamped is a kernel's stdout or stderr message with the "timestamp" the
// E2B SDKs read (Python's parse_output fails on a message without one
// when on_stdout or on_stderr is given): the time it was read.
func stamped(msg []byte) []byte {
	var m map[string]json.RawMessage
	if json.Unmarshal(msg, &m) != nil {
		return msg
	}
	m["timestamp"], _ = json.Marshal(time.Now().UTC().Format(time.RFC3339Nano))
	b, err := json.Marshal(m)
	if err != nil {
		return msg
	}
	return b
}

// interruptWait is how long an interrupted cell has to end before its
// kernel is killed.
const interruptWait = 5 * time.Second

// interrupt sends SIGINT to a kernel whose execution nobody waits for any
// more (Python raises KeyboardInterrupt in the cell, Node breaks the
// script) and reads up to that execution's end (c.exec's), so the next one
// starts after it. A cell that does not end within interruptWait (it
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
	c.pid = 0
	c.resetOutput()
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
	// The default python and javascript contexts are listed before their
	// first use, as E2B starts them with the sandbox (each kernel still
	// starts on its first execution).
	for _, lang := range []string{"python", "javascript"} {
		if m["default-"+lang] == nil {
			c := defaultContext(lang)
			m[c.ID] = c
		}
	}
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
	// The kernel is stopped under c.mu, as execute and restartContext
	// change c.pid; an execution waiting for the context finds it removed
	// instead of starting a kernel nobody would stop. One running now
	// holds c.mu until its cell ends: its kernel, found by its tag (c.pid
	// is the execution's), is killed first, which ends it.
	ctx := context.WithoutCancel(r.Context())
	c.removed.Store(true)
	if !c.mu.TryLock() {
		if procs, err := h.svc.Processes(ctx, t.caller, t.id); err == nil {
			if pr, ok := runningTagged(procs, kernelTag(c)); ok {
				_ = h.svc.Signal(ctx, t.caller, t.id, pr.PID, "SIGKILL")
			}
		}
		c.mu.Lock()
	}
	h.stopKernel(ctx, t, c)
	c.mu.Unlock()
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
	if c.removed.Load() {
		h.writeError(w, r, errdefs.NotFound("context %s was removed", c.ID))
		return
	}
	h.stopKernel(r.Context(), t, c)
	if err := h.startKernel(r.Context(), t, c); err != nil {
		h.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
