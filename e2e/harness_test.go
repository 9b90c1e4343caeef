// Package e2e runs the real `space serve` binary with the real gVisor driver
// and drives it over real HTTP, as a user would.
package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/testenv"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// spaceBin returns the space binary: $SPACE_BIN or one built for the test run.
func spaceBin(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("SPACE_BIN"); p != "" {
		return p
	}
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "space-bin-")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "space")
		out, err := exec.Command("go", "build", "-o", binPath, "github.com/spacesandbox/space/cmd/space").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("%v: %s", err, out)
		}
	})
	if binErr != nil {
		t.Fatalf("build space: %v", binErr)
	}
	return binPath
}

// server is one `space serve` process on its own data dir.
type server struct {
	t     testing.TB
	extra []string // extra `space serve` flags
	data  string
	url   string
	key   string
	cmd   *exec.Cmd
	logs  *bytes.Buffer
	mu    sync.Mutex
}

// startServer starts a server on a fresh data dir (or on data, to restart).
func startServer(t testing.TB, data string, extra ...string) *server {
	t.Helper()
	if data == "" {
		data = t.TempDir()
	}
	s := &server{t: t, data: data, logs: &bytes.Buffer{}, extra: extra}
	s.start()
	t.Cleanup(func() { s.stop(true) })
	return s
}

func (s *server) start() {
	t := s.t
	t.Helper()
	_ = os.Remove(filepath.Join(s.data, "serve.json"))
	args := append([]string{"serve", "--data", s.data, "--listen", "127.0.0.1:0",
		"--cache", testenv.CacheDir(), "--runsc", testenv.Runsc(t), "--agent", testenv.Agent(t), "--log-level", "debug"}, s.extra...)
	cmd := exec.Command(spaceBin(t), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			s.mu.Lock()
			s.logs.WriteString(sc.Text() + "\n")
			s.mu.Unlock()
		}
	}()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.cmd = cmd
	deadline := time.Now().Add(15 * time.Minute) // a cold template build on first run
	for {
		if b, err := os.ReadFile(filepath.Join(s.data, "serve.json")); err == nil {
			var v struct{ URL string }
			if json.Unmarshal(b, &v) == nil && v.URL != "" {
				s.url = v.URL
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("server did not start:\n%s", s.logText())
		}
		time.Sleep(20 * time.Millisecond)
	}
	k, err := os.ReadFile(filepath.Join(s.data, "api-key"))
	if err != nil {
		t.Fatal(err)
	}
	s.key = strings.TrimSpace(string(k))
	for {
		resp, err := http.Get(s.url + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("server never healthy:\n%s", s.logText())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *server) logText() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.logs.String()
}

// stop ends the server: gracefully, or with SIGKILL when hard is false...
// hard=true is used by cleanup and kills every sandbox first.
func (s *server) stop(cleanup bool) {
	if s.cmd == nil {
		return
	}
	if cleanup && s.url != "" {
		// Destroy what the test left so no runsc outlives it.
		var list struct {
			Sandboxes []struct{ ID string } `json:"sandboxes"`
		}
		if code := s.do("GET", "/v1/sandboxes", s.key, nil, &list); code == 200 {
			for _, sb := range list.Sandboxes {
				s.do("DELETE", "/v1/sandboxes/"+sb.ID, s.key, nil, nil)
			}
		}
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second): // a graceful stop drains the warm pool
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
	s.cmd = nil
	if s.t != nil && s.t.Failed() {
		os.WriteFile("/tmp/last-server.log", []byte(s.logText()), 0o644)
		s.t.Logf("server log (full: /tmp/last-server.log):\n%s", tail(s.logText(), 8000))
	}
}

// kill9 kills the server process with SIGKILL (sandboxes keep running).
func (s *server) kill9() {
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	s.cmd.Wait()
	s.cmd = nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// do sends a JSON request and decodes a JSON answer into out; it returns the
// status code.
func (s *server) do(method, path, key string, body any, out any) int {
	s.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	case string:
		rd = strings.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		rd = bytes.NewReader(j)
	}
	req, _ := http.NewRequest(method, s.url+path, rd)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if out != nil && len(data) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			s.t.Fatalf("%s %s: decode %q: %v", method, path, data, err)
		}
	}
	return resp.StatusCode
}

type sandboxView struct {
	ID        string            `json:"id"`
	State     string            `json:"state"`
	Reason    string            `json:"reason"`
	Template  string            `json:"template"`
	Driver    string            `json:"driver"`
	CPU       int               `json:"cpu"`
	Metadata  map[string]string `json:"metadata"`
	CreatedAt time.Time         `json:"created_at"`
	ExpiresAt time.Time         `json:"expires_at"`
}

type apiError struct {
	Code    int    `json:"code"`
	Error   string `json:"error"`
	Message string `json:"message"`
	State   string `json:"state"`
}

// create makes a sandbox with the admin key and returns its id.
func (s *server) create(body map[string]any) string {
	s.t.Helper()
	if body == nil {
		body = map[string]any{}
	}
	var sb sandboxView
	if code := s.do("POST", "/v1/sandboxes", s.key, body, &sb); code != 201 {
		s.t.Fatalf("create: %d %+v", code, sb)
	}
	if sb.ID == "" || sb.State != "running" {
		s.t.Fatalf("create: %+v", sb)
	}
	return sb.ID
}

type execResult struct {
	PID       int    `json:"pid"`
	CommandID int64  `json:"command_id"`
	ExitCode  int    `json:"exit_code"`
	Signal    string `json:"signal"`
	Error     string `json:"error"`
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	StdoutB64 string `json:"stdout_b64"`
}

// sh runs a shell script (JSON mode) and returns the result.
func (s *server) sh(id, script string) execResult {
	s.t.Helper()
	var r execResult
	if code := s.do("POST", "/v1/sandboxes/"+id+"/exec", s.key, map[string]any{"cmd": script}, &r); code != 200 {
		s.t.Fatalf("exec %q: %d", script, code)
	}
	return r
}

// procView is a process as GET /v1/sandboxes/{id}/processes lists it.
type procView struct {
	PID     int  `json:"pid"`
	Running bool `json:"running"`
}

// processes lists a sandbox's processes.
func (s *server) processes(id string) []procView {
	s.t.Helper()
	var ps struct{ Processes []procView }
	if code := s.do("GET", "/v1/sandboxes/"+id+"/processes", s.key, nil, &ps); code != 200 {
		s.t.Fatalf("list processes of %s: %d", id, code)
	}
	return ps.Processes
}

// mustLive fails unless sandbox id is running and runs a command.
func (s *server) mustLive(id, when string) {
	s.t.Helper()
	var sb sandboxView
	if code := s.do("GET", "/v1/sandboxes/"+id, s.key, nil, &sb); code != 200 || sb.State != "running" {
		s.t.Fatalf("%s: %d %+v", when, code, sb)
	}
	if r := s.sh(id, "echo alive"); r.Stdout != "alive\n" {
		s.t.Fatalf("%s: exec %+v", when, r)
	}
}

// sseEvent is one parsed server-sent event.
type sseEvent struct {
	ID    string
	Event string
	Data  string
}

// readSSE parses an SSE stream until EOF.
func readSSE(t testing.TB, r io.Reader, each func(sseEvent) bool) {
	t.Helper()
	br := bufio.NewReaderSize(r, 1<<20)
	var ev sseEvent
	var data []string
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return
		}
		line = strings.TrimRight(line, "\n")
		switch {
		case line == "":
			if ev.Event != "" || len(data) > 0 {
				ev.Data = strings.Join(data, "\n")
				if !each(ev) {
					return
				}
			}
			ev, data = sseEvent{}, nil
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "id: "):
			ev.ID = line[4:]
		case strings.HasPrefix(line, "event: "):
			ev.Event = line[7:]
		case strings.HasPrefix(line, "data: "):
			data = append(data, line[6:])
		}
	}
}

// stream posts an exec (or GETs a path) with Accept: text/event-stream.
func (s *server) stream(method, path string, body any, hdr map[string]string) *http.Response {
	s.t.Helper()
	var rd io.Reader
	if body != nil {
		j, _ := json.Marshal(body)
		rd = bytes.NewReader(j)
	}
	req, _ := http.NewRequest(method, s.url+path, rd)
	req.Header.Set("Authorization", "Bearer "+s.key)
	req.Header.Set("Accept", "text/event-stream")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func waitFor(t testing.TB, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// quietT stands in for a test when the shared server stops after all tests.
type quietT struct{ testing.TB }

func (quietT) Helper()               {}
func (quietT) Failed() bool          { return false }
func (quietT) Logf(string, ...any)   {}
func (quietT) Fatalf(string, ...any) {}
func (quietT) Fatal(...any)          {}
func (quietT) Cleanup(func())        {}
