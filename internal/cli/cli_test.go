package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	space "github.com/spacesandbox/space/sdk/go"
	"github.com/spf13/pflag"
)

func TestParseLocation(t *testing.T) {
	tests := []struct {
		in      string
		want    location
		wantErr bool
	}{
		{"sb_1:/work/a.txt", location{ID: "sb_1", Path: "/work/a.txt"}, false},
		{"sb_1:/work/dir/", location{ID: "sb_1", Path: "/work/dir"}, false},
		{"sb_1:/", location{ID: "sb_1", Path: "/"}, false},
		{"sb_1:relative", location{}, true},
		{"./a:b", location{Path: "./a:b"}, false},
		{"/tmp/x:y", location{Path: "/tmp/x:y"}, false},
		{"local.txt", location{Path: "local.txt"}, false},
		{":/x", location{Path: ":/x"}, false},
		{"-", location{Path: "-"}, false},
		{"", location{}, true},
	}
	for _, tt := range tests {
		got, err := parseLocation(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("parseLocation(%q) = %+v, %v; want %+v, err %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestParseKV(t *testing.T) {
	tests := []struct {
		in      []string
		want    map[string]string
		wantErr bool
	}{
		{nil, nil, false},
		{[]string{"A=1", "B=x=y", "C="}, map[string]string{"A": "1", "B": "x=y", "C": ""}, false},
		{[]string{"A=1", "A=2"}, map[string]string{"A": "2"}, false},
		{[]string{"NOEQUALS"}, nil, true},
		{[]string{"=v"}, nil, true},
	}
	for _, tt := range tests {
		got, err := parseKV("env", tt.in)
		if (err != nil) != tt.wantErr || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("parseKV(%q) = %v, %v; want %v, err %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestExitStatus(t *testing.T) {
	tests := []struct {
		code   int
		signal string
		want   int
	}{
		{0, "", 0},
		{3, "", 3},
		{-1, "SIGKILL", 137},
		{0, "SIGTERM", 143},
		{0, "INT", 130},
		{0, "sigsegv", 139},
		{0, "15", 143},
		{0, "SIGWEIRD", 137},
	}
	for _, tt := range tests {
		if got := exitStatus(tt.code, tt.signal); got != tt.want {
			t.Errorf("exitStatus(%d, %q) = %d, want %d", tt.code, tt.signal, got, tt.want)
		}
	}
}

func TestBuildExecRequest(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		dash    int
		fl      execFlags
		wantID  string
		want    space.ExecRequest
		wantErr bool
	}{
		{"argv after dash", []string{"sb1", "ls", "-l"}, 1, execFlags{}, "sb1", space.ExecRequest{Cmd: []string{"ls", "-l"}}, false},
		{"one arg with spaces stays argv", []string{"sb1", "echo hi"}, 1, execFlags{}, "sb1", space.ExecRequest{Cmd: []string{"echo hi"}}, false},
		{"no dash", []string{"sb1", "true"}, -1, execFlags{}, "sb1", space.ExecRequest{Cmd: []string{"true"}}, false},
		{"shell", []string{"sb1"}, -1, execFlags{shell: "ls | wc -l", cwd: "/tmp", env: []string{"A=1"}, timeout: 5},
			"sb1", space.ExecRequest{Shell: "ls | wc -l", Cwd: "/tmp", Env: map[string]string{"A": "1"}, TimeoutS: 5}, false},
		{"shell and argv", []string{"sb1", "ls"}, 1, execFlags{shell: "ls"}, "", space.ExecRequest{}, true},
		{"no command", []string{"sb1"}, -1, execFlags{}, "", space.ExecRequest{}, true},
		{"no id", []string{"ls"}, 0, execFlags{}, "", space.ExecRequest{}, true},
		{"extra before dash", []string{"sb1", "x", "ls"}, 2, execFlags{}, "", space.ExecRequest{}, true},
		{"bad env", []string{"sb1", "ls"}, 1, execFlags{env: []string{"A"}}, "", space.ExecRequest{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, req, err := buildExecRequest(tt.args, tt.dash, tt.fl)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("got %+v, want error", req)
				}
				return
			}
			if err != nil || id != tt.wantID || !reflect.DeepEqual(req, tt.want) {
				t.Fatalf("got %q %+v %v; want %q %+v", id, req, err, tt.wantID, tt.want)
			}
		})
	}
}

func TestResolveClientConfig(t *testing.T) {
	data := t.TempDir()
	os.WriteFile(filepath.Join(data, "serve.json"), []byte(`{"url":"http://127.0.0.1:7070"}`), 0o644)
	os.WriteFile(filepath.Join(data, "api-key"), []byte("admin-key\n"), 0o600)
	empty := t.TempDir()
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

	tests := []struct {
		name                  string
		flagURL, flagKey, dir string
		env                   map[string]string
		wantURL, wantKey      string
		wantErr               bool
	}{
		{"data dir flag", "", "", data, nil, "http://127.0.0.1:7070", "admin-key", false},
		{"SPACE_DATA", "", "", "", map[string]string{"SPACE_DATA": data}, "http://127.0.0.1:7070", "admin-key", false},
		{"env wins over files", "", "", data, map[string]string{"SPACE_URL": "http://h:1", "SPACE_API_KEY": "k"}, "http://h:1", "k", false},
		{"flags win over env", "http://f:2", "fk", data, map[string]string{"SPACE_URL": "http://h:1", "SPACE_API_KEY": "k"}, "http://f:2", "fk", false},
		{"no serve.json", "", "", empty, nil, "", "", true},
		{"url without key is fine", "http://h:1", "", empty, nil, "http://h:1", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := resolveClientConfig(tt.flagURL, tt.flagKey, tt.dir, env(tt.env))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if err == nil && (cfg.URL != tt.wantURL || cfg.Key != tt.wantKey) {
				t.Fatalf("got %+v, want url %q key %q", cfg, tt.wantURL, tt.wantKey)
			}
		})
	}
}

// fakeServer implements a few endpoints the way the real server does.
func fakeServer(t *testing.T) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	auth := func(h http.HandlerFunc) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "Bearer admin-key" {
				writeErr(w, 401, "unauthenticated", "missing or invalid API key")
				return
			}
			h(w, r)
		}
	}
	mux.HandleFunc("POST /v1/sandboxes", auth(func(w http.ResponseWriter, r *http.Request) {
		var req map[string]any
		json.NewDecoder(r.Body).Decode(&req)
		if req["template"] != "py" || req["timeout_s"] != 60.0 || !reflect.DeepEqual(req["metadata"], map[string]any{"owner": "me"}) {
			writeErr(w, 400, "invalid_argument", fmt.Sprintf("unexpected request %v", req))
			return
		}
		w.WriteHeader(201)
		json.NewEncoder(w).Encode(map[string]any{"id": "sb_42", "state": "running", "template": "py"})
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}", auth(func(w http.ResponseWriter, r *http.Request) {
		writeErr(w, 404, "not_found", "sandbox "+r.PathValue("id")+" not found")
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/exec", auth(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Cmd   any    `json:"cmd"`
			Stdin string `json:"stdin"`
		}
		json.NewDecoder(r.Body).Decode(&req)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "id: 1\nevent: start\ndata: {\"pid\":5}\n\n: keepalive\n\n")
		cmd, _ := json.Marshal(req.Cmd)
		fmt.Fprintf(w, "id: 2\nevent: stdout\ndata: {\"data\":%q}\n\n", "cmd="+string(cmd)+" stdin="+req.Stdin+"\n")
		fmt.Fprint(w, "id: 3\nevent: stderr\ndata: {\"data_b64\":\"/w==\"}\n\n")
		if req.Cmd == "crash" {
			fmt.Fprint(w, "id: 4\nevent: exit\ndata: {\"exit_code\":-1,\"signal\":\"SIGKILL\",\"error\":\"timeout\"}\n\n")
			return
		}
		fmt.Fprint(w, "id: 4\nevent: exit\ndata: {\"exit_code\":7}\n\n")
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}/processes", auth(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"processes":[{"pid":5,"cmd":["sleep","9"],"user":"root","cwd":"/","pty":false,"started_at":"2025-01-01T00:00:00Z","running":false,"exit_code":0}]}`)
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}/files/stat", auth(func(w http.ResponseWriter, r *http.Request) {
		switch p := r.URL.Query().Get("path"); p {
		case "/work":
			json.NewEncoder(w).Encode(map[string]any{"name": "work", "path": p, "type": "dir", "mode": 0o755})
		case "/work/remote.txt":
			json.NewEncoder(w).Encode(map[string]any{"name": "remote.txt", "path": p, "type": "file", "mode": 0o640, "size": 6})
		default:
			writeErr(w, 404, "not_found", "no such file")
		}
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}/files", auth(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "remote")
	}))
	mux.HandleFunc("PUT /v1/sandboxes/{id}/files", auth(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		uploads[r.URL.Query().Get("path")] = string(b)
		uploadSums[r.URL.Query().Get("path")] = r.URL.Query().Get("sha256")
		json.NewEncoder(w).Encode(map[string]any{"path": r.URL.Query().Get("path"), "size": len(b)})
	}))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// uploads records PUT bodies by path (tests run sequentially).
var uploads = map[string]string{}

// uploadSums records the sha256 query of each PUT by path.
var uploadSums = map[string]string{}

func writeErr(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"code": status, "error": code, "message": msg})
}

// runCLI runs the CLI against srv through a data dir, as a local user would.
func runCLI(t *testing.T, srv *httptest.Server, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	data := t.TempDir()
	os.WriteFile(filepath.Join(data, "serve.json"), []byte(`{"url":"`+srv.URL+`"}`), 0o644)
	os.WriteFile(filepath.Join(data, "api-key"), []byte("admin-key\n"), 0o600)
	var out, errb bytes.Buffer
	getenv := func(k string) string {
		if k == "SPACE_DATA" {
			return data
		}
		return ""
	}
	code = run(t.Context(), args, strings.NewReader(stdin), &out, &errb, getenv)
	return code, out.String(), errb.String()
}

func TestCLICreate(t *testing.T) {
	srv := fakeServer(t)
	code, out, errOut := runCLI(t, srv, "", "create", "--template", "py", "--timeout", "60", "--metadata", "owner=me")
	if code != 0 || out != "sb_42\n" || errOut != "" {
		t.Fatalf("code %d stdout %q stderr %q", code, out, errOut)
	}
	code, out, errOut = runCLI(t, srv, "", "create", "--template", "other")
	if code != 1 || out != "" || !strings.HasPrefix(errOut, "space: unexpected request") {
		t.Fatalf("code %d stdout %q stderr %q", code, out, errOut)
	}
}

func TestCLIExec(t *testing.T) {
	srv := fakeServer(t)
	tests := []struct {
		name      string
		stdin     string
		args      []string
		code      int
		out, errs string
	}{
		{"argv", "", []string{"exec", "sb_42", "--", "echo hi", "x"}, 7, "cmd=[\"echo hi\",\"x\"] stdin=\n", "\xff"},
		{"shell with stdin", "input", []string{"exec", "sb_42", "--shell", "cat | wc", "--stdin"}, 7, "cmd=\"cat | wc\" stdin=input\n", "\xff"},
		{"killed by signal", "", []string{"exec", "sb_42", "--shell", "crash"}, 137, "cmd=\"crash\" stdin=\n", "\xffspace: command ended: timeout\n"},
		{"usage", "", []string{"exec", "sb_42"}, 1, "", "space: missing command (usage: space exec <id> [flags] -- <cmd> [args...])\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, srv, tt.stdin, tt.args...)
			if code != tt.code || out != tt.out || errOut != tt.errs {
				t.Fatalf("code %d stdout %q stderr %q; want %d %q %q", code, out, errOut, tt.code, tt.out, tt.errs)
			}
		})
	}
}

func TestCLIErrors(t *testing.T) {
	srv := fakeServer(t)
	code, _, errOut := runCLI(t, srv, "", "timeout", "sb_x", "abc")
	if code != 1 || !strings.Contains(errOut, "bad timeout") {
		t.Fatalf("code %d stderr %q", code, errOut)
	}
	code, out, _ := runCLI(t, srv, "", "ps", "sb_1")
	if code != 0 || !strings.Contains(out, "exited 0") || !strings.Contains(out, "sleep 9") {
		t.Fatalf("ps: %d %q", code, out)
	}
	// Without a key the hint names how to give one.
	var stdout, errb bytes.Buffer
	code = run(t.Context(), []string{"--url", srv.URL, "--data", t.TempDir(), "ps", "sb_1"}, strings.NewReader(""), &stdout, &errb, func(string) string { return "" })
	if code != 1 || !strings.Contains(errb.String(), "space: missing or invalid API key (no API key: pass --api-key") {
		t.Fatalf("code %d stderr %q", code, errb.String())
	}
}

func TestCLICp(t *testing.T) {
	srv := fakeServer(t)
	dir := t.TempDir()
	local := filepath.Join(dir, "local.txt")
	os.WriteFile(local, []byte("hello"), 0o644)

	// Upload into a directory keeps the base name.
	if code, _, errOut := runCLI(t, srv, "", "cp", local, "sb_42:/work"); code != 0 {
		t.Fatalf("upload: %d %s", code, errOut)
	}
	if uploads["/work/local.txt"] != "hello" {
		t.Fatalf("uploads = %v", uploads)
	}
	// A local file goes with its SHA-256, which the server checks.
	if got := uploadSums["/work/local.txt"]; got != "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824" {
		t.Errorf("cp sent sha256 %q", got)
	}
	// Upload to a new name.
	if code, _, errOut := runCLI(t, srv, "", "cp", local, "sb_42:/work/new.txt"); code != 0 || uploads["/work/new.txt"] != "hello" {
		t.Fatalf("upload: %d %s %v", code, errOut, uploads)
	}
	// Download into a local directory keeps the base name and the mode.
	if code, _, errOut := runCLI(t, srv, "", "cp", "sb_42:/work/remote.txt", dir); code != 0 {
		t.Fatalf("download: %d %s", code, errOut)
	}
	b, err := os.ReadFile(filepath.Join(dir, "remote.txt"))
	if err != nil || string(b) != "remote" {
		t.Fatalf("downloaded %q %v", b, err)
	}
	if st, _ := os.Stat(filepath.Join(dir, "remote.txt")); st.Mode().Perm() != 0o640 {
		t.Fatalf("mode %v", st.Mode())
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 2 {
		t.Fatalf("temp files left behind: %v", ents)
	}
	// A missing remote file leaves nothing behind.
	if code, _, errOut := runCLI(t, srv, "", "cp", "sb_42:/nope", filepath.Join(dir, "x")); code != 1 || !strings.Contains(errOut, "no such file") {
		t.Fatalf("got %d %q", code, errOut)
	}
	if code, _, _ := runCLI(t, srv, "", "cp", local, filepath.Join(dir, "y")); code != 1 {
		t.Fatal("local-to-local copy accepted")
	}
}

func TestServeFlagsFromEnv(t *testing.T) {
	var listen, driver string
	var maxT int
	flags := []serveFlag{
		{name: "listen", env: "SPACE_LISTEN", str: &listen},
		{name: "driver", env: "SPACE_DRIVER", str: &driver},
		{name: "max-timeout", env: "SPACE_MAX_TIMEOUT", num: &maxT},
	}
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	fs.StringVar(&listen, "listen", "", "")
	fs.StringVar(&driver, "driver", "", "")
	fs.IntVar(&maxT, "max-timeout", 0, "")
	if err := fs.Parse([]string{"--listen", "0.0.0.0:1"}); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"SPACE_LISTEN": "ignored:2", "SPACE_DRIVER": "qemu", "SPACE_MAX_TIMEOUT": "60"}
	if err := applyServeEnv(fs, flags, func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if listen != "0.0.0.0:1" || driver != "qemu" || maxT != 60 {
		t.Fatalf("listen %q driver %q max %d", listen, driver, maxT)
	}
	env["SPACE_MAX_TIMEOUT"] = "1h"
	if err := applyServeEnv(fs, flags, func(k string) string { return env[k] }); err == nil {
		t.Fatal("bad SPACE_MAX_TIMEOUT accepted")
	}
	// Every documented serve flag exists.
	cmd := (&app{}).serveCommand()
	for _, name := range []string{"cache", "listen", "driver", "runsc", "agent", "template", "log-level", "log-format", "default-timeout", "max-timeout"} {
		if cmd.Flags().Lookup(name) == nil {
			t.Errorf("serve has no --%s", name)
		}
	}
}

func TestVersionAndHelp(t *testing.T) {
	var out bytes.Buffer
	if code := run(t.Context(), []string{"version"}, nil, &out, io.Discard, func(string) string { return "" }); code != 0 || !strings.HasPrefix(out.String(), "space ") {
		t.Fatalf("version: %d %q", code, out.String())
	}
	out.Reset()
	if code := run(t.Context(), []string{"--help"}, nil, &out, io.Discard, func(string) string { return "" }); code != 0 || !strings.Contains(out.String(), "serve") {
		t.Fatalf("help: %d %q", code, out.String())
	}
}
