package space

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// fake starts a server whose handler is h and returns a client for it.
func fake(t *testing.T, h http.HandlerFunc) *Client {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return NewClient(srv.URL+"/", "k3y")
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func TestErrorDecoding(t *testing.T) {
	tests := []struct {
		name   string
		status int
		body   string
		want   APIError
		is     func(error) bool
	}{
		{"api error", 404, `{"code":404,"error":"not_found","message":"sandbox sb1 not found"}`,
			APIError{Status: 404, Code: "not_found", Message: "sandbox sb1 not found"}, IsNotFound},
		{"conflict with state", 409, `{"code":409,"error":"conflict","message":"sandbox is paused","state":"paused"}`,
			APIError{Status: 409, Code: "conflict", Message: "sandbox is paused", State: "paused"}, IsConflict},
		{"plain text", 502, "bad gateway\n",
			APIError{Status: 502, Code: "unavailable", Message: "bad gateway"}, IsUnavailable},
		{"html", 504, "<html>timeout</html>",
			APIError{Status: 504, Code: "deadline_exceeded", Message: "Gateway Timeout (HTTP 504)"}, IsDeadlineExceeded},
		{"empty", 401, "",
			APIError{Status: 401, Code: "unauthenticated", Message: "Unauthorized (HTTP 401)"}, IsUnauthenticated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := fake(t, func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tt.status)
				io.WriteString(w, tt.body)
			})
			_, err := c.GetSandbox(t.Context(), "sb1")
			var ae *APIError
			if !errors.As(err, &ae) {
				t.Fatalf("got %T %v, want *APIError", err, err)
			}
			if *ae != tt.want {
				t.Fatalf("got %+v, want %+v", *ae, tt.want)
			}
			if !tt.is(fmt.Errorf("wrapped: %w", err)) {
				t.Fatalf("class helper does not match %v", err)
			}
			if IsInternal(err) {
				t.Fatal("IsInternal matched a different class")
			}
		})
	}
}

func TestAPIErrorMessage(t *testing.T) {
	e := &APIError{Status: 409, Code: "conflict", Message: "cannot pause", State: "stopped"}
	if got := e.Error(); got != "cannot pause (state stopped)" {
		t.Fatalf("Error() = %q", got)
	}
}

func TestCreateSandbox(t *testing.T) {
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "POST" || r.URL.Path != "/v1/sandboxes" {
			t.Errorf("got %s %s", r.Method, r.URL.Path)
		}
		if got := r.Header.Get("Authorization"); got != "Bearer k3y" {
			t.Errorf("Authorization = %q", got)
		}
		var body map[string]any
		json.NewDecoder(r.Body).Decode(&body)
		want := map[string]any{"template": "py", "timeout_s": 60.0, "env": map[string]any{"A": "1"}}
		if !reflect.DeepEqual(body, want) {
			t.Errorf("body = %v, want %v", body, want)
		}
		writeJSON(w, 201, map[string]any{"id": "sb1", "state": "running", "template": "py", "driver": "gvisor",
			"cpu": 1, "memory_mb": 512, "timeout_s": 60, "metadata": map[string]string{},
			"created_at": "2025-01-02T03:04:05Z", "expires_at": "2025-01-02T03:05:05Z"})
	})
	sb, err := c.CreateSandbox(t.Context(), CreateSandboxRequest{Template: "py", TimeoutS: 60, Env: map[string]string{"A": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID != "sb1" || sb.State != StateRunning || sb.MemoryMB != 512 || sb.ExpiresAt.Sub(sb.CreatedAt) != time.Minute || sb.StoppedAt != nil {
		t.Fatalf("got %+v", sb)
	}
}

func TestAllSandboxesFollowsCursor(t *testing.T) {
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if !reflect.DeepEqual(q["state"], []string{"running", "paused"}) || !reflect.DeepEqual(q["metadata"], []string{"a=1", "b=x=y"}) {
			t.Errorf("query = %v", q)
		}
		switch q.Get("cursor") {
		case "":
			writeJSON(w, 200, map[string]any{"sandboxes": []map[string]string{{"id": "a"}, {"id": "b"}}, "next_cursor": "c2"})
		case "c2":
			writeJSON(w, 200, map[string]any{"sandboxes": []map[string]string{{"id": "c"}}})
		}
	})
	var ids []string
	opts := ListOptions{State: []State{StateRunning, StatePaused}, Metadata: map[string]string{"b": "x=y", "a": "1"}}
	for sb, err := range c.AllSandboxes(t.Context(), opts) {
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	if strings.Join(ids, ",") != "a,b,c" {
		t.Fatalf("ids = %v", ids)
	}
}

func TestExecJSON(t *testing.T) {
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		json.NewDecoder(r.Body).Decode(&body)
		if body["cmd"] != "echo hi | cat" {
			t.Errorf("cmd = %#v, want a shell string", body["cmd"])
		}
		writeJSON(w, 200, map[string]any{"pid": 7, "exit_code": 3, "stdout": "hi\n", "stderr_b64": "gA=="})
	})
	res, err := c.Exec(t.Context(), "sb1", ExecRequest{Shell: "echo hi | cat"})
	if err != nil {
		t.Fatal(err)
	}
	if res.PID != 7 || res.ExitCode != 3 || string(res.Stdout) != "hi\n" || string(res.Stderr) != "\x80" {
		t.Fatalf("got %+v", res)
	}
}

func TestExecRequestJSON(t *testing.T) {
	b, err := json.Marshal(ExecRequest{Cmd: []string{"ls -l"}, Cwd: "/tmp", Background: true})
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"cmd":["ls -l"],"cwd":"/tmp","background":true}` {
		t.Fatalf("got %s", b)
	}
	if _, err := json.Marshal(ExecRequest{}); err == nil {
		t.Fatal("empty command accepted")
	}
	if _, err := json.Marshal(ExecRequest{Cmd: []string{"a"}, Shell: "b"}); err == nil {
		t.Fatal("Cmd and Shell accepted together")
	}
}

func TestExecStreamAndEvents(t *testing.T) {
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Accept") != "text/event-stream" {
			t.Errorf("Accept = %q", r.Header.Get("Accept"))
		}
		w.Header().Set("Content-Type", "text/event-stream")
		switch {
		case r.URL.Path == "/v1/sandboxes/sb1/exec":
			fmt.Fprint(w, ": keepalive\n\nid: 1\nevent: start\ndata: {\"pid\":9}\n\n")
			w.(http.Flusher).Flush()
			fmt.Fprint(w, "id: 2\nevent: stdout\ndata: {\"data\":\"out\"}\n\nid: 3\nevent: exit\ndata: {\"exit_code\":0}\n\n")
		case r.URL.Path == "/v1/sandboxes/sb1/processes/9/events":
			if r.Header.Get("Last-Event-ID") != "2" || r.URL.Query().Get("follow") != "false" {
				t.Errorf("Last-Event-ID = %q, query %v", r.Header.Get("Last-Event-ID"), r.URL.Query())
			}
			fmt.Fprint(w, "id: 3\nevent: exit\ndata: {\"exit_code\":0}\n\n")
		default:
			t.Errorf("unexpected %s", r.URL)
		}
	})
	s, err := c.ExecStream(t.Context(), "sb1", ExecRequest{Cmd: []string{"echo"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var types []string
	for {
		ev, err := s.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		types = append(types, ev.Type)
	}
	if strings.Join(types, ",") != "start,stdout,exit" {
		t.Fatalf("types = %v", types)
	}
	s2, err := c.BufferedEvents(t.Context(), "sb1", 9, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if ev, err := s2.Next(); err != nil || ev.Type != EventExit || ev.Seq != 3 {
		t.Fatalf("got %+v %v", ev, err)
	}
}

// TestWriteFileStreams checks that the upload reaches the server while the
// caller is still producing it: a buffering client would deadlock here.
func TestWriteFileStreams(t *testing.T) {
	firstChunk := make(chan string)
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "PUT" || r.URL.Query().Get("path") != "/work/a b.txt" {
			t.Errorf("got %s %s", r.Method, r.URL)
		}
		buf := make([]byte, 5)
		if _, err := io.ReadFull(r.Body, buf); err != nil {
			t.Error(err)
		}
		firstChunk <- string(buf)
		rest, _ := io.ReadAll(r.Body)
		writeJSON(w, 200, map[string]any{"name": "a b.txt", "path": "/work/a b.txt", "type": "file", "size": 5 + len(rest), "mode": 0o644})
	})
	pr, pw := io.Pipe()
	go func() {
		pw.Write([]byte("hello"))
		select {
		case got := <-firstChunk:
			if got != "hello" {
				t.Errorf("first chunk = %q", got)
			}
		case <-time.After(10 * time.Second):
			t.Error("server did not see the first chunk before the upload finished: body is buffered")
		}
		pw.Write([]byte(" world"))
		pw.Close()
	}()
	fi, err := c.WriteFile(t.Context(), "sb1", "/work/a b.txt", pr)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size != 11 || fi.Type != FileTypeFile || fi.Mode != 0o644 {
		t.Fatalf("got %+v", fi)
	}
}

func TestWriteFileSendsLengthAndLeavesFileOpen(t *testing.T) {
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength != 3 {
			t.Errorf("ContentLength = %d, want 3", r.ContentLength)
		}
		io.Copy(io.Discard, r.Body)
		writeJSON(w, 200, map[string]any{"size": 3})
	})
	p := filepath.Join(t.TempDir(), "f")
	os.WriteFile(p, []byte("abcd"), 0o600)
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.Seek(1, io.SeekStart)
	if _, err := c.WriteFile(t.Context(), "sb1", "/f", f); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Stat(); err != nil {
		t.Fatalf("caller's file was closed: %v", err)
	}
}

func TestReadFileAndFileOps(t *testing.T) {
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.Method + " " + r.URL.Path {
		case "GET /v1/sandboxes/sb1/files":
			if r.URL.Query().Get("path") == "/missing" {
				writeJSON(w, 404, map[string]any{"code": 404, "error": "not_found", "message": "no such file"})
				return
			}
			io.WriteString(w, "contents")
		case "GET /v1/sandboxes/sb1/files/list":
			if r.URL.Query().Get("depth") != "2" {
				t.Errorf("depth = %q", r.URL.Query().Get("depth"))
			}
			writeJSON(w, 200, map[string]any{"entries": []map[string]any{{"name": "d", "type": "dir"}}})
		case "POST /v1/sandboxes/sb1/files/move":
			var b map[string]string
			json.NewDecoder(r.Body).Decode(&b)
			writeJSON(w, 200, map[string]any{"path": b["to"]})
		case "DELETE /v1/sandboxes/sb1/files":
			if r.URL.Query().Get("recursive") != "true" {
				t.Errorf("recursive not set")
			}
			w.WriteHeader(204)
		default:
			t.Errorf("unexpected %s %s", r.Method, r.URL)
		}
	})
	ctx := t.Context()
	rc, err := c.ReadFile(ctx, "sb1", "/x")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "contents" {
		t.Fatalf("got %q", b)
	}
	if _, err := c.ReadFile(ctx, "sb1", "/missing"); !IsNotFound(err) {
		t.Fatalf("got %v, want not found", err)
	}
	ents, err := c.ListFiles(ctx, "sb1", "/", 2)
	if err != nil || len(ents) != 1 || !ents[0].IsDir() {
		t.Fatalf("got %v %v", ents, err)
	}
	if fi, err := c.Move(ctx, "sb1", "/a", "/b"); err != nil || fi.Path != "/b" {
		t.Fatalf("got %v %v", fi, err)
	}
	if err := c.Remove(ctx, "sb1", "/d", true); err != nil {
		t.Fatal(err)
	}
}

func TestHealth(t *testing.T) {
	ready := false
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" {
			t.Error("healthz sent credentials")
		}
		if ready {
			writeJSON(w, 200, map[string]string{"status": "ok"})
			return
		}
		writeJSON(w, 503, map[string]string{"status": "starting", "detail": "building runsc"})
	})
	h, err := c.Health(t.Context())
	if !IsUnavailable(err) || h == nil || h.Detail != "building runsc" {
		t.Fatalf("got %+v %v", h, err)
	}
	ready = true
	if h, err := c.Health(t.Context()); err != nil || h.Status != "ok" {
		t.Fatalf("got %+v %v", h, err)
	}
}

func TestBuildTemplate(t *testing.T) {
	tests := []struct {
		name, stream string
		wantErr      func(error) bool
	}{
		{"done", "event: progress\ndata: {\"line\":\"step 1\"}\n\nevent: progress\ndata: {\"line\":\"step 2\"}\n\nevent: done\ndata: {\"name\":\"py\",\"status\":\"ready\"}\n\n", nil},
		{"error", "event: progress\ndata: {\"line\":\"step 1\"}\n\nevent: error\ndata: {\"code\":500,\"error\":\"internal\",\"message\":\"apt failed\"}\n\n", IsInternal},
		{"truncated", "event: progress\ndata: {\"line\":\"step 1\"}\n\n", func(err error) bool { return errors.Is(err, io.ErrUnexpectedEOF) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := fake(t, func(w http.ResponseWriter, r *http.Request) {
				if r.Method != "POST" || r.URL.Path != "/v1/templates/py/build" {
					t.Errorf("got %s %s", r.Method, r.URL)
				}
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, tt.stream)
			})
			var lines []string
			tpl, err := c.BuildTemplate(t.Context(), "py", func(l string) { lines = append(lines, l) })
			if tt.wantErr != nil {
				if !tt.wantErr(err) {
					t.Fatalf("got err %v", err)
				}
				return
			}
			if err != nil || tpl.Name != "py" || strings.Join(lines, "|") != "step 1|step 2" {
				t.Fatalf("got %+v %v %v", tpl, err, lines)
			}
		})
	}
}

func TestKeys(t *testing.T) {
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case "POST":
			writeJSON(w, 201, map[string]any{"id": "k1", "key": "sk_secret", "team": "t"})
		case "GET":
			writeJSON(w, 200, map[string]any{"keys": []map[string]any{{"id": "k1", "team": "t"}}})
		case "DELETE":
			if r.URL.Path != "/v1/keys/k1" {
				t.Errorf("path %s", r.URL.Path)
			}
			w.WriteHeader(204)
		}
	})
	ctx := t.Context()
	k, err := c.CreateKey(ctx, CreateKeyRequest{Team: "t"})
	if err != nil || k.Key != "sk_secret" {
		t.Fatalf("got %+v %v", k, err)
	}
	keys, err := c.ListKeys(ctx)
	if err != nil || len(keys) != 1 || keys[0].Key != "" {
		t.Fatalf("got %+v %v", keys, err)
	}
	if err := c.DeleteKey(ctx, "k1"); err != nil {
		t.Fatal(err)
	}
}

// SetPool sends size 0 (it turns a pool off) and only the fields given;
// ResetPool names the driver only when given.
func TestSetPoolAndResetPool(t *testing.T) {
	var got []string
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = append(got, r.Method+" "+r.URL.RequestURI()+" "+strings.TrimSpace(string(b)))
		writeJSON(w, 200, map[string]any{"template": "base", "driver": "qemu", "size": 0, "source": "flags", "state": "running", "updated_at": "2026-12-02T07:00:00Z"})
	})
	ctx := t.Context()
	if _, err := c.SetPool(ctx, "base", SetPoolRequest{Size: 0}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetPool(ctx, "python-data", SetPoolRequest{Size: 3, Max: 9, Driver: "qemu", MemoryMB: 1024, CPU: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ResetPool(ctx, "base", ""); err != nil {
		t.Fatal(err)
	}
	p, err := c.ResetPool(ctx, "base", "qemu")
	if err != nil || p.Source != "flags" || p.Driver != "qemu" || p.UpdatedAt.IsZero() {
		t.Fatalf("ResetPool = %+v, %v", p, err)
	}
	want := []string{
		`PUT /v1/pools/base {"size":0}`,
		`PUT /v1/pools/python-data {"size":3,"max":9,"driver":"qemu","memory_mb":1024,"cpu":2}`,
		`DELETE /v1/pools/base `,
		`DELETE /v1/pools/base?driver=qemu `,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("requests:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// AllCommands follows next_cursor until the last page.
func TestAllCommands(t *testing.T) {
	var queries []string
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/sandboxes/sb1/commands" {
			t.Errorf("path %s", r.URL.Path)
		}
		queries = append(queries, r.URL.RawQuery)
		switch r.URL.Query().Get("cursor") {
		case "":
			writeJSON(w, 200, map[string]any{"commands": []map[string]any{{"pid": 1, "cmd": []string{"a"}, "state": "exited", "exit_code": 0}}, "next_cursor": "7"})
		case "7":
			writeJSON(w, 200, map[string]any{"commands": []map[string]any{{"pid": 2, "cmd": []string{"b"}, "state": "unknown"}}})
		}
	})
	var pids []int
	for cmd, err := range c.AllCommands(t.Context(), "sb1") {
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, cmd.PID)
	}
	if !reflect.DeepEqual(pids, []int{1, 2}) || !reflect.DeepEqual(queries, []string{"", "cursor=7"}) {
		t.Fatalf("pids %v, queries %q", pids, queries)
	}
	if _, err := c.Commands(t.Context(), "sb1", 5, "7"); err != nil || queries[2] != "cursor=7&limit=5" {
		t.Fatalf("Commands with limit and cursor: %v, query %q", err, queries[2])
	}
}

func TestPTY(t *testing.T) {
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer k3y" || r.URL.Query().Get("cols") != "100" {
			t.Errorf("headers %v query %v", r.Header, r.URL.Query())
		}
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			t.Error(err)
			return
		}
		ctx := r.Context()
		_, msg, _ := ws.Read(ctx) // resize
		if !strings.Contains(string(msg), `"resize"`) {
			t.Errorf("first message %s", msg)
		}
		_, in, _ := ws.Read(ctx)
		ws.Write(ctx, websocket.MessageBinary, append([]byte("echo: "), in...))
		ws.Write(ctx, websocket.MessageText, []byte(`{"type":"exit","exit_code":3}`))
		ws.Close(websocket.StatusNormalClosure, "")
	})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	p, err := c.PTY(ctx, "sb1", 100, 30, "")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Resize(120, 40); err != nil {
		t.Fatal(err)
	}
	p.Write([]byte("ls"))
	out, err := io.ReadAll(p)
	if err != nil || string(out) != "echo: ls" {
		t.Fatalf("got %q %v", out, err)
	}
	if code, err := p.Wait(); err != nil || code != 3 {
		t.Fatalf("Wait = %d %v", code, err)
	}
}

func TestPTYDialError(t *testing.T) {
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 404, map[string]any{"code": 404, "error": "not_found", "message": "no sandbox"})
	})
	if _, err := c.PTY(t.Context(), "sb1", 0, 0, ""); !IsNotFound(err) {
		t.Fatalf("got %v", err)
	}
}

// Twenty calls at once, twice: the second round reuses the first round's
// connections (http.DefaultClient keeps only two idle ones per host).
func TestConcurrentCallsReuseConnections(t *testing.T) {
	var mu sync.Mutex
	opened := 0
	arrived, release := make(chan struct{}), make(chan struct{})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release // hold every call until all twenty are in flight
		writeJSON(w, 200, map[string]string{"status": "ok"})
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			mu.Lock()
			opened++
			mu.Unlock()
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	c := NewClient(srv.URL, "k3y")
	round := func() {
		var wg sync.WaitGroup
		for range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := c.Health(t.Context()); err != nil {
					t.Error(err)
				}
			}()
		}
		for range 20 {
			<-arrived
		}
		for range 20 {
			release <- struct{}{}
		}
		wg.Wait()
	}
	round()
	mu.Lock()
	first := opened
	mu.Unlock()
	round()
	mu.Lock()
	defer mu.Unlock()
	if first < 2 || opened != first {
		t.Fatalf("connections opened: %d in the first round, %d in the second", first, opened-first)
	}
}

func TestPortTransport(t *testing.T) {
	var got *http.Request
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		got = r
		io.WriteString(w, "from the sandbox")
	})
	if u := c.PortURL("sb-1", 8000); !strings.HasSuffix(u, "/v1/sandboxes/sb-1/ports/8000") {
		t.Errorf("PortURL = %q", u)
	}
	hc := &http.Client{Transport: c.PortTransport("sb-1", 8000)}
	req, _ := http.NewRequest("GET", "http://anything.invalid/api/items?page=2", nil)
	req.SetBasicAuth("app", "pw") // the app's own: it must reach the app
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "from the sandbox" || got.URL.Path != "/v1/sandboxes/sb-1/ports/8000/api/items" || got.URL.RawQuery != "page=2" ||
		got.Header.Get("X-API-Key") != "k3y" || got.Header.Get("Authorization") != req.Header.Get("Authorization") {
		t.Errorf("request: %s %s %q key %q auth %q; body %q", got.Method, got.URL.Path, got.URL.RawQuery, got.Header.Get("X-API-Key"), got.Header.Get("Authorization"), b)
	}
}

func TestWriteFileAsAndMkdirAs(t *testing.T) {
	var got []string
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = append(got, r.Method+" "+r.URL.Path+"?"+r.URL.RawQuery+" "+string(b))
		io.WriteString(w, `{"path":"/x"}`)
	})
	ctx := context.Background()
	c.WriteFileAs(ctx, "sb-1", "/etc/x", "root", strings.NewReader("data"))
	c.WriteFile(ctx, "sb-1", "/home/user/x", strings.NewReader("d"))
	c.MkdirAs(ctx, "sb-1", "/opt/d", "root")
	c.Mkdir(ctx, "sb-1", "/home/user/d")
	want := []string{
		"PUT /v1/sandboxes/sb-1/files?path=%2Fetc%2Fx&user=root data",
		"PUT /v1/sandboxes/sb-1/files?path=%2Fhome%2Fuser%2Fx d",
		`POST /v1/sandboxes/sb-1/files/mkdir? {"path":"/opt/d","user":"root"}`,
		`POST /v1/sandboxes/sb-1/files/mkdir? {"path":"/home/user/d"}`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("requests:\n%q\nwant\n%q", got, want)
	}
}

// TestExecTruncatedAndResume: an exec result says when the server dropped
// output; a resumed event stream keeps its resume point until it delivers
// an event (one that broke first resumed from the start again, repeating
// everything), and a truncated marker names the first event kept.
func TestExecTruncatedAndResume(t *testing.T) {
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/v1/sandboxes/sb1/exec":
			writeJSON(w, 200, map[string]any{"pid": 7, "exit_code": 0, "stdout": "part", "truncated": true})
		default:
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "event: truncated\ndata: {\"first_seq\":40}\n\n")
		}
	})
	res, err := c.Exec(t.Context(), "sb1", ExecRequest{Shell: "yes"})
	if err != nil || !res.Truncated {
		t.Errorf("exec result %+v %v: want Truncated", res, err)
	}
	s, err := c.Events(t.Context(), "sb1", 7, 57)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.LastSeq() != 57 {
		t.Errorf("LastSeq before any event of a stream resumed after 57: %d", s.LastSeq())
	}
	ev, err := s.Next()
	if err != nil || ev.Type != EventTruncated || ev.Seq != 40 {
		t.Errorf("truncated marker: %+v %v", ev, err)
	}
	if s.LastSeq() != 57 {
		t.Errorf("LastSeq after a marker without an id: %d", s.LastSeq())
	}
}

// TestBodyLengthOfPseudoFile: a regular file whose size is 0 (a /proc
// file) is sent chunked, as read: its length was taken as 0 and the upload
// wrote an empty file, reported as success.
func TestBodyLengthOfPseudoFile(t *testing.T) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Skip(err)
	}
	defer f.Close()
	if n := bodyLength(f); n != -1 {
		t.Errorf("bodyLength(/proc/self/status) = %d, want -1 (unknown)", n)
	}
}
