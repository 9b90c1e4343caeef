package e2b

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/spacesandbox/space/internal/agent/agenttest"
	"github.com/spacesandbox/space/internal/agentclient"
	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

// kernelFiles writes language's kernel driver into a temporary directory
// and returns that directory and the command that runs it there.
func kernelFiles(t *testing.T, language string) (dir string, argv []string) {
	t.Helper()
	file, src, argv := kernelOf(language)
	dir = t.TempDir()
	path := filepath.Join(dir, filepath.Base(file))
	if err := os.WriteFile(path, src, 0o644); err != nil {
		t.Fatal(err)
	}
	for i, a := range argv {
		if a == file {
			argv[i] = path
		}
	}
	return dir, argv
}

// hostKernel is a kernel driver run on the host (python3 and node, as in
// the templates), fed requests one at a time on a pipe as the agent feeds
// a sandbox's kernel.
type hostKernel struct {
	t    *testing.T
	in   io.WriteCloser
	msgs chan map[string]any
}

func startHostKernel(t *testing.T, language string, env ...string) *hostKernel {
	t.Helper()
	dir, argv := kernelFiles(t, language)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // the kernel and what its cells started
		_ = cmd.Wait()
	})
	k := &hostKernel{t: t, in: in, msgs: make(chan map[string]any, 100)}
	go func() {
		defer close(k.msgs)
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 16<<20)
		for sc.Scan() {
			_, msg, ok := strings.Cut(sc.Text(), string(rune(msgMark)))
			var m map[string]any
			if ok && json.Unmarshal([]byte(msg), &m) == nil {
				k.msgs <- m
			}
		}
	}()
	return k
}

// exec sends one request (with an id) and returns its execution's
// messages, from its number_of_executions (which must repeat the id) to
// its end_of_execution, both left out; nil when it did not end within 15
// seconds.
func (k *hostKernel) exec(req map[string]any) []map[string]any {
	k.t.Helper()
	req["id"] = newExecID()
	b, _ := json.Marshal(req)
	if _, err := k.in.Write(append(b, '\n')); err != nil {
		k.t.Fatalf("request %s: %v", b, err)
	}
	got := []map[string]any{}
	timeout := time.After(15 * time.Second)
	for {
		select {
		case m, ok := <-k.msgs:
			if !ok {
				k.t.Fatalf("the kernel exited during %s (messages %v)", b, got)
			}
			switch m["type"] {
			case "number_of_executions":
				if m["id"] != req["id"] {
					k.t.Errorf("number_of_executions %v for request id %v", m, req["id"])
				}
			case "end_of_execution":
				return got
			default:
				got = append(got, m)
			}
		case <-timeout:
			return nil
		}
	}
}

// outcome sums up an execution's messages: its main result's text (or
// stdout when it has none) and its error's name.
func outcome(msgs []map[string]any) (text, errName string) {
	var stdout strings.Builder
	for _, m := range msgs {
		switch m["type"] {
		case "result":
			if m["is_main_result"] == true {
				text, _ = m["text"].(string)
			}
		case "stdout":
			s, _ := m["text"].(string)
			stdout.WriteString(s)
		case "error":
			errName, _ = m["name"].(string)
		}
	}
	if text == "" {
		text = stdout.String()
	}
	return text, errName
}

// TestKernelEnv: what a cell does to the environment stays for the next
// cell (os.environ, process.env, export), as in a Jupyter kernel; a
// request's env is there for its own cell only, and the keys it set are
// put back afterwards (unset, or the kernel's value); a request env the
// environment cannot hold (a name with "=" or NUL) fails that execution,
// not the kernel. The Python and JavaScript kernels used to restore their
// whole environment after each cell (a cell's os.environ["K"] or
// load_dotenv() was lost); Python set a request's env outside its try
// and died on a bad name.
func TestKernelEnv(t *testing.T) {
	for _, tc := range []struct {
		language    string
		set, check  string
		wantSet     string
		wantChecked string
	}{
		{"python", "import os\nos.environ['SPACE_K'] = '1'\nos.environ['SPACE_REQ']",
			"import os\nf\"{os.environ.get('SPACE_K')} {os.environ.get('SPACE_T')} {os.environ.get('SPACE_REQ', '-')}\"",
			"req", "1 pool -"},
		{"javascript", "process.env.SPACE_K = '1'; process.env.SPACE_REQ",
			"`${process.env.SPACE_K} ${process.env.SPACE_T} ${process.env.SPACE_REQ ?? '-'}`",
			"req", "1 pool -"},
		{"bash", "export SPACE_K=1; echo \"$SPACE_REQ\"",
			"echo \"$SPACE_K $SPACE_T ${SPACE_REQ:--}\"",
			"req\n", "1 pool -\n"},
	} {
		t.Run(tc.language, func(t *testing.T) {
			k := startHostKernel(t, tc.language, "SPACE_T=pool")
			env := map[string]any{"SPACE_REQ": "req", "SPACE_T": "req"}
			if text, errName := outcome(k.exec(map[string]any{"code": tc.set, "env": env})); text != tc.wantSet || errName != "" {
				t.Errorf("cell with a request env: %q, error %q; want %q", text, errName, tc.wantSet)
			}
			if tc.language != "bash" { // bash.py skips names bash cannot take
				bad := k.exec(map[string]any{"code": "1", "env": map[string]any{"BAD=NAME": "x", "NUL\x00": "x"}})
				if bad == nil {
					t.Fatal("an execution with a bad env name did not end")
				}
			}
			if text, errName := outcome(k.exec(map[string]any{"code": tc.check})); text != tc.wantChecked || errName != "" {
				t.Errorf("next cell: %q, error %q; want %q (the cell's change kept, the request's env put back)", text, errName, tc.wantChecked)
			}
		})
	}
}

// TestKernelStdinPrivate: a cell's subprocess inherits the kernel's fd 0,
// which is not where the requests come from: `cat` started by a cell
// reads end-of-file instead of the next requests (it used to swallow
// them, and the context hung).
func TestKernelStdinPrivate(t *testing.T) {
	for _, tc := range []struct{ language, start, check string }{
		{"python", "import subprocess\np = subprocess.Popen(['cat'])", "1 + 1"},
		{"bash", "cat & sleep 0.2", "echo 2"},
	} {
		t.Run(tc.language, func(t *testing.T) {
			k := startHostKernel(t, tc.language)
			if msgs := k.exec(map[string]any{"code": tc.start}); msgs == nil {
				t.Fatal("the cell starting cat did not end")
			}
			time.Sleep(200 * time.Millisecond) // cat is reading by now
			for i := range 3 {
				msgs := k.exec(map[string]any{"code": tc.check})
				if text, _ := outcome(msgs); strings.TrimSpace(text) != "2" {
					t.Fatalf("request %d after the cell that started cat: %q (%v)", i, text, msgs)
				}
			}
			if tc.language == "python" {
				if text, errName := outcome(k.exec(map[string]any{"code": "p.wait(5)"})); text != "0" || errName != "" {
					t.Errorf("cat: exit %q, error %q; want 0 (end of file at once)", text, errName)
				}
			}
		})
	}
}

// agentKernel is a kernel driver run on the host under a real agent (the
// agent a sandbox runs, on a unix socket as agentclient's tests have it),
// read as execute reads a sandbox's kernel: codeContext.read over the
// agent's event stream.
type agentKernel struct {
	t  *testing.T
	ac *agentclient.Client
	c  *codeContext
}

func startAgentKernel(t *testing.T, language string) *agentKernel {
	t.Helper()
	dir, argv := kernelFiles(t, language)
	ac := agenttest.Client(t, dir)
	pid, err := ac.Start(t.Context(), agentproto.StartRequest{Cmd: argv, Cwd: dir, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	return &agentKernel{t: t, ac: ac, c: &codeContext{ID: "test", Language: language, pid: pid, seq: 1}}
}

// send writes a request as execute does and returns its id.
func (k *agentKernel) send(code string) string {
	k.t.Helper()
	id := newExecID()
	if err := k.ac.Stdin(k.t.Context(), k.c.pid, bytes.NewReader(requestLine(id, code, nil)), false); err != nil {
		k.t.Fatal(err)
	}
	return id
}

type output struct {
	kind, text string
	msg        map[string]any
	part       int // len(c.part) when it was passed on
}

// read reads execution id's output as execute does (within 30 s) and
// reports whether it ended.
func (k *agentKernel) read(id string) ([]output, bool) {
	k.t.Helper()
	ctx, cancel := context.WithTimeout(k.t.Context(), 30*time.Second)
	defer cancel()
	evs, err := k.ac.Events(ctx, k.c.pid, k.c.seq, true)
	if err != nil {
		k.t.Fatal(err)
	}
	defer evs.Close()
	k.c.exec, k.c.started = id, false
	var got []output
	done := k.c.read(evs, func(kind, text string, msg json.RawMessage) {
		o := output{kind: kind, text: text, part: len(k.c.part)}
		if msg != nil {
			if err := json.Unmarshal(msg, &o.msg); err != nil {
				k.t.Errorf("message %s: %v", msg, err)
			}
			o.kind = o.msg["type"].(string)
		}
		got = append(got, o)
	})
	return got, done
}

// stdout is the stdout an execution's output holds, raw and in messages.
func stdout(outs []output) string {
	var b strings.Builder
	for _, o := range outs {
		switch {
		case o.msg == nil && o.kind == "stdout":
			b.WriteString(o.text)
		case o.kind == "stdout":
			b.WriteString(o.msg["text"].(string))
		}
	}
	return b.String()
}

// TestReadOwnExecution: an execution's answer is its own output, found by
// its request's id, whatever the kernel printed before it: here the whole
// of an earlier execution nobody read (as when the request reached the
// kernel but reading its output failed, or when a fork's child finds a
// kernel by its tag in the middle of a cell). read used to stop at the
// first end_of_execution, and every later answer was the execution
// before's. A kernel of an older server (no id in its number_of_executions)
// is still read.
func TestReadOwnExecution(t *testing.T) {
	k := startAgentKernel(t, "python")
	k.send("import time\nprint('A1')\ntime.sleep(0.5)\nprint('A2')\n'A'")
	id := k.send("print('B')\n'B'")
	outs, done := k.read(id)
	if !done {
		t.Fatal("B did not end")
	}
	if got := stdout(outs); got != "B\n" {
		t.Errorf("B's stdout: %q", got)
	}
	for _, o := range outs {
		if o.kind == "number_of_executions" {
			if o.msg["execution_count"] != 2.0 || o.msg["id"] != nil {
				t.Errorf("B's number_of_executions: %v (want count 2, without the facade's id)", o.msg)
			}
		}
		if o.kind == "result" && o.msg["text"] != "B" {
			t.Errorf("B's result: %v", o.msg)
		}
	}
	if last := outs[len(outs)-1]; last.kind != "end_of_execution" {
		t.Errorf("B ends with %+v", last)
	}

	// A request without an id, as an older server's kernel answers.
	if err := k.ac.Stdin(t.Context(), k.c.pid, strings.NewReader(`{"code": "print('C')"}`+"\n"), false); err != nil {
		t.Fatal(err)
	}
	if outs, done := k.read(newExecID()); !done || stdout(outs) != "C\n" {
		t.Errorf("an execution without an id: %q, ended %v", stdout(outs), done)
	}
}

// TestReadStampsOutput: the kernel's stdout and stderr messages are passed
// on with a timestamp, which the Python SDK's parse_output reads when
// on_stdout or on_stderr is given (KeyError without it).
func TestReadStampsOutput(t *testing.T) {
	k := startAgentKernel(t, "python")
	before := time.Now()
	outs, done := k.read(k.send("import sys\nprint('out')\nprint('err', file=sys.stderr)"))
	if !done {
		t.Fatal("the execution did not end")
	}
	n := 0
	for _, o := range outs {
		if o.kind != "stdout" && o.kind != "stderr" || o.msg == nil {
			continue
		}
		n++
		ts, _ := o.msg["timestamp"].(string)
		at, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil || at.Before(before.Add(-time.Second)) || at.After(time.Now().Add(time.Second)) {
			t.Errorf("%s message %v: timestamp %q (%v)", o.kind, o.msg, ts, err)
		}
	}
	if n != 2 {
		t.Errorf("%d stdout/stderr messages, want 2: %+v", n, outs)
	}
}

// TestReadBoundsLines: kernel output without a newline is not held
// without bound (a cell running `cat /dev/zero` made the server hold all
// of it): raw text is passed on in pieces of about maxRawLine, each whole
// UTF-8; a message line longer than maxMessageLine is dropped, and what
// follows it is read as before.
func TestReadBoundsLines(t *testing.T) {
	k := startAgentKernel(t, "python")
	// One 'a' then 2-byte characters: a cut at a chunk's end (the
	// agent's chunks are of even sizes) falls inside one.
	const n = 3 << 20 / 2
	outs, done := k.read(k.send("import os\nwith os.fdopen(1, 'wb', closefd=False) as f:\n    f.write(b'a' + 'é'.encode() * " + itoa(n) + ")\nprint('end')"))
	if !done {
		t.Fatal("the execution did not end")
	}
	want := "a" + strings.Repeat("é", n)
	if got := stdout(outs); got != want+"end\n" {
		t.Errorf("stdout: %d bytes, want %d", len(got), len(want)+4)
	}
	pieces := 0
	for _, o := range outs {
		if o.msg == nil && o.kind == "stdout" {
			pieces++
			if !utf8.ValidString(o.text) {
				t.Errorf("a piece of %d bytes cuts a character", len(o.text))
			}
			if len(o.text) > 2*maxRawLine { // the bound and a chunk of the agent's
				t.Errorf("a piece of %d bytes", len(o.text))
			}
		}
		if o.part > 2*maxRawLine {
			t.Errorf("%d bytes held of an unfinished line", o.part)
		}
	}
	if pieces < 2 {
		t.Errorf("%d bytes without a newline came in %d pieces", len(want), pieces)
	}

	old := maxMessageLine
	maxMessageLine = 1 << 20
	t.Cleanup(func() { maxMessageLine = old })
	outs, done = k.read(k.send("display('x' * (2 << 20))\ndisplay('small')\nprint('after')"))
	if !done {
		t.Fatal("the execution with a big message did not end")
	}
	var results []string
	for _, o := range outs {
		if o.kind == "result" {
			results = append(results, o.msg["text"].(string))
		}
		if o.part > 2*maxMessageLine {
			t.Errorf("%d bytes held of an unfinished message", o.part)
		}
	}
	if len(results) != 1 || results[0] != "small" || stdout(outs) != "after\n" {
		t.Errorf("after a message over the bound: results %.40q, stdout %q; want only 'small' and after", results, stdout(outs))
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// testHandler is the facade on a real sandbox service and store, with a
// running sandbox of team "t1" whose agent is not attached: every call
// into it fails as for a sandbox whose agent cannot be reached.
func testHandler(t *testing.T) (*Handler, *sandbox.Service, string) {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(t.Context(), filepath.Join(dir, "space.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	log := slog.New(slog.DiscardHandler)
	svc := sandbox.New(sandbox.Config{DataDir: dir}, st, nil, log, nil)
	const id = "sb-abc234"
	if err := st.CreateSandbox(t.Context(), store.Sandbox{ID: id, Team: "t1", State: sandbox.StateRunning}); err != nil {
		t.Fatal(err)
	}
	h, err := New(Config{Service: svc, Store: st, DataDir: dir, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	return h, svc, id
}

// withContext gives h's sandbox id a context c whose kernel (pid) was
// found by its tag and read before, as after a first execution.
func withContext(h *Handler, id string, pid int) *codeContext {
	c := &codeContext{ID: "0123abcd", Language: "python", Cwd: "/home/user", pid: pid, seq: 7}
	h.interpState.sandboxes[id] = map[string]*codeContext{c.ID: c}
	return c
}

// interpRequest is a request for the interpreter mux, as serveInterpreter
// passes it on.
func interpRequest(ctx context.Context, id, method, path, body string) *http.Request {
	r := httptest.NewRequestWithContext(ctx, method, path, strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	return r.WithContext(context.WithValue(ctx, targetKey{}, envdTarget{id: id, caller: sandbox.Caller{Team: "t1"}}))
}

// TestExecuteKeepsKernel: an execution that cannot be sent does not cost
// the context its kernel unless the kernel is gone. A client that left
// while an earlier execution held the context sends nothing; a request
// the sandbox could not take (its agent unreachable: nobody can say the
// kernel is gone) is an error, and the kernel is kept. Both used to set
// the context's pid to 0: its next execution started a fresh kernel, and
// the old one, state and all, ran on unused.
func TestExecuteKeepsKernel(t *testing.T) {
	h, _, id := testHandler(t)
	c := withContext(h, id, 4242)

	c.mu.Lock()
	ctx, cancel := context.WithCancel(t.Context())
	w := httptest.NewRecorder()
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.interp.ServeHTTP(w, interpRequest(ctx, id, "POST", "/execute", `{"code": "1", "context_id": "0123abcd"}`))
	}()
	time.Sleep(100 * time.Millisecond) // waiting for c.mu
	cancel()
	c.mu.Unlock()
	<-done
	c.mu.Lock()
	if c.pid != 4242 {
		t.Errorf("after a client left waiting: pid %d, want the kernel kept", c.pid)
	}
	c.mu.Unlock()

	w = httptest.NewRecorder()
	h.interp.ServeHTTP(w, interpRequest(t.Context(), id, "POST", "/execute", `{"code": "1", "context_id": "0123abcd"}`))
	if w.Code != http.StatusServiceUnavailable {
		t.Errorf("the agent unreachable: %d %s", w.Code, w.Body)
	}
	if c.pid != 4242 {
		t.Errorf("after the agent could not take a request: pid %d, want the kernel kept", c.pid)
	}
}

// TestExecuteEnvVars: env_vars a kernel cannot hold are a 400, before any
// kernel sees them (the Python kernel died on a name with '=').
func TestExecuteEnvVars(t *testing.T) {
	h, _, id := testHandler(t)
	withContext(h, id, 0)
	for _, env := range []string{`{"A=B": "x"}`, `{"": "x"}`, `{"A\u0000": "x"}`, `{"1A": "x"}`, `{"A": "x\u0000"}`} {
		w := httptest.NewRecorder()
		h.interp.ServeHTTP(w, interpRequest(t.Context(), id, "POST", "/execute", `{"code": "1", "env_vars": `+env+`}`))
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if w.Code != http.StatusBadRequest || json.Unmarshal(w.Body.Bytes(), &e) != nil || e.Code != 400 || !strings.Contains(e.Message, "env_vars") {
			t.Errorf("env_vars %s: %d %s", env, w.Code, w.Body)
		}
	}
}

// TestRemoveContextWaits: DELETE /contexts changes the context's kernel
// under its lock, as executions do (it used to write pid beside a running
// execution), and an execution that waited for the context finds it
// removed instead of starting a kernel nobody would stop.
func TestRemoveContextWaits(t *testing.T) {
	h, _, id := testHandler(t)
	c := withContext(h, id, 4242)

	c.mu.Lock() // an execution runs
	exec := httptest.NewRecorder()
	executed := make(chan struct{})
	go func() {
		defer close(executed)
		h.interp.ServeHTTP(exec, interpRequest(t.Context(), id, "POST", "/execute", `{"code": "1", "context_id": "0123abcd"}`))
	}()
	time.Sleep(100 * time.Millisecond) // the execution waits for c.mu
	del := httptest.NewRecorder()
	removed := make(chan struct{})
	go func() {
		defer close(removed)
		h.interp.ServeHTTP(del, interpRequest(t.Context(), id, "DELETE", "/contexts/0123abcd", ""))
	}()
	time.Sleep(200 * time.Millisecond)
	if c.pid != 4242 {
		t.Errorf("the removal changed pid to %d while an execution held the context", c.pid)
	}
	c.mu.Unlock()
	<-removed
	<-executed
	if del.Code != http.StatusNoContent {
		t.Errorf("DELETE: %d %s", del.Code, del.Body)
	}
	if exec.Code != http.StatusNotFound {
		t.Errorf("the execution that waited: %d %s, want 404", exec.Code, exec.Body)
	}
	if c.pid != 0 || !c.removed.Load() {
		t.Errorf("after the removal: pid %d, removed %v", c.pid, c.removed.Load())
	}
}

// TestSandboxTrafficRateLimit: the code interpreter's port counts against
// the team's request rate, as envd's port does (429 with Retry-After);
// /health does not, and neither does the sandbox's own server on other
// ports (as on the native API's port proxy).
func TestSandboxTrafficRateLimit(t *testing.T) {
	h, svc, id := testHandler(t)
	if err := svc.SetQuota(t.Context(), sandbox.Caller{Admin: true}, "t1", store.Quota{MaxRPS: 1}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		port, path string
		limited    bool
	}{{"49999", "/contexts", true}, {"8080", "/", false}} {
		limited := 0
		for range 3 {
			r := httptest.NewRequest("GET", tc.path, nil)
			r.Header.Set("E2b-Sandbox-Id", e2bID(id))
			r.Header.Set("E2b-Sandbox-Port", tc.port)
			r.Header.Set("E2B-Traffic-Access-Token", h.trafficToken(id))
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code == http.StatusTooManyRequests && w.Header().Get("Retry-After") == "1" {
				limited++
			}
		}
		if tc.limited && limited == 0 {
			t.Errorf("port %s: 3 requests at once at 1/s, none refused", tc.port)
		}
		if !tc.limited && limited > 0 {
			// A sandbox's own server (a page and its assets) is not
			// counted against the team's API rate, as on the native API.
			t.Errorf("port %s: %d of 3 requests refused by the API rate limit", tc.port, limited)
		}
	}
	r := httptest.NewRequest("GET", "/health", nil)
	r.Header.Set("E2b-Sandbox-Id", e2bID(id))
	r.Header.Set("E2b-Sandbox-Port", "49999")
	r.Header.Set("E2B-Traffic-Access-Token", h.trafficToken(id))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusOK {
		t.Errorf("interpreter /health while limited: %d", w.Code)
	}
}
