package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	space "github.com/spacesandbox/space/sdk/go"
)

// bearer adds an API key to every request of the MCP client.
type bearer struct{ key string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	return http.DefaultTransport.RoundTrip(r)
}

// mcpConnect connects the Go SDK's client to the server's /mcp with key.
func mcpConnect(t *testing.T, ctx context.Context, s *server, key string) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "space-e2e", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: s.url + "/mcp", HTTPClient: &http.Client{Transport: bearer{key}}}, nil)
	if err != nil {
		t.Fatalf("connect to /mcp: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// call runs a tool that must succeed and returns its text content.
func call(t *testing.T, ctx context.Context, cs *mcp.ClientSession, name string, args map[string]any) (string, *mcp.CallToolResult) {
	t.Helper()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	text := contentText(res)
	if res.IsError {
		t.Fatalf("%s(%v): tool error: %s", name, args, text)
	}
	return text, res
}

// callErr runs a tool that must fail and returns its message: a tool
// error, or a protocol error for arguments the schema refuses.
func callErr(t *testing.T, ctx context.Context, cs *mcp.ClientSession, name string, args map[string]any) string {
	t.Helper()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		return err.Error()
	}
	if !res.IsError {
		t.Fatalf("%s(%v) succeeded, want an error: %s", name, args, contentText(res))
	}
	return contentText(res)
}

func contentText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func decodeText[T any](t *testing.T, text string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(text), &v); err != nil {
		t.Fatalf("decode %q: %v", tail(text, 500), err)
	}
	return v
}

type mcpCommandOut struct {
	PID       int    `json:"pid"`
	ExitCode  int    `json:"exit_code"`
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	Truncated bool   `json:"truncated"`
	OutputURI string `json:"output_uri"`
}

func readResource(t *testing.T, ctx context.Context, cs *mcp.ClientSession, uri string) (*mcp.ResourceContents, error) {
	t.Helper()
	r, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
	if err != nil {
		return nil, err
	}
	if len(r.Contents) != 1 {
		t.Fatalf("read %s: %d contents", uri, len(r.Contents))
	}
	return r.Contents[0], nil
}

// TestMCP drives every tool and resource of /mcp with the Go SDK's client
// over real HTTP against a real server and gVisor sandboxes: a team key
// reaches its own sandboxes only, no key is a 401, bad arguments are tool
// errors, and command output is cut with a marker while the resource
// holds all of it.
func TestMCP(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real sandboxes")
	}
	s := startServer(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	// No key, a wrong key: 401 with the API's JSON error, before MCP.
	for _, key := range []string{"", "sk_space_wrong"} {
		req, _ := http.NewRequest("POST", s.url+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 401 || !strings.Contains(string(body), `"unauthenticated"`) {
			t.Errorf("key %q: /mcp answered %d %s, want 401 unauthenticated", key, resp.StatusCode, body)
		}
	}

	alpha := mcpConnect(t, ctx, s, s.teamKey("alpha"))
	beta := mcpConnect(t, ctx, s, s.teamKey("beta"))

	tl, err := alpha.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range tl.Tools {
		names = append(names, tool.Name)
		if tool.InputSchema == nil {
			t.Errorf("tool %s has no input schema", tool.Name)
		}
	}
	for _, want := range []string{"sandbox_create", "sandbox_list", "command_run", "code_run", "file_read", "file_write", "file_list", "snapshot_create", "file_restore", "sandbox_fork", "sandbox_kill"} {
		if !slices.Contains(names, want) {
			t.Errorf("tools %v lack %s", names, want)
		}
	}
	rt, err := alpha.ListResourceTemplates(ctx, nil)
	if err != nil || len(rt.ResourceTemplates) != 2 {
		t.Fatalf("resource templates: %v %v", rt, err)
	}

	// sandbox_create with a network allowlist: the policy is the API's.
	text, _ := call(t, ctx, alpha, "sandbox_create", map[string]any{"timeout_s": 600, "network_allow": []string{"example.com"}, "metadata": map[string]string{"by": "mcp"}})
	sb := decodeText[struct {
		ID    string `json:"id"`
		State string `json:"state"`
	}](t, text)
	if sb.ID == "" || sb.State != "running" {
		t.Fatalf("sandbox_create: %s", text)
	}
	id := sb.ID
	var netw struct{ Allow []string }
	if code := s.do("GET", "/v1/sandboxes/"+id+"/network", s.key, nil, &netw); code != 200 || !slices.Equal(netw.Allow, []string{"example.com"}) {
		t.Errorf("network of the MCP-made sandbox: %d %v", code, netw.Allow)
	}

	text, _ = call(t, ctx, alpha, "sandbox_list", nil)
	if !strings.Contains(text, id) {
		t.Errorf("sandbox_list lacks %s: %s", id, text)
	}
	text, _ = call(t, ctx, beta, "sandbox_list", nil)
	if strings.Contains(text, id) {
		t.Errorf("team beta's sandbox_list shows alpha's %s: %s", id, text)
	}

	// command_run: exit code, streams, cwd, env.
	text, _ = call(t, ctx, alpha, "command_run", map[string]any{"sandbox_id": id, "command": "echo $GREETING; pwd; echo oops >&2; exit 3", "cwd": "/tmp", "env": map[string]string{"GREETING": "hi"}})
	out := decodeText[mcpCommandOut](t, text)
	if out.ExitCode != 3 || out.Stdout != "hi\n/tmp\n" || out.Stderr != "oops\n" || out.Truncated {
		t.Errorf("command_run: %+v", out)
	}
	if c, err := readResource(t, ctx, alpha, out.OutputURI); err != nil || !strings.Contains(c.Text, "hi\n") || !strings.Contains(c.Text, "oops\n") {
		t.Errorf("output resource %s: %+v %v", out.OutputURI, c, err)
	}

	// timeout_s kills the command; the result says so.
	text, _ = call(t, ctx, alpha, "command_run", map[string]any{"sandbox_id": id, "command": "echo started; sleep 60", "timeout_s": 1})
	if out := decodeText[mcpCommandOut](t, text); out.Stdout != "started\n" || !strings.Contains(text, `"error": "timeout"`) {
		t.Errorf("command_run past its timeout: %s", text)
	}

	// Truncation: 100000 bytes of output come back as the first and last
	// 8 KiB around a marker naming the resource, which has all of it.
	text, _ = call(t, ctx, alpha, "command_run", map[string]any{"sandbox_id": id, "command": "head -c 50000 /dev/zero | tr '\\0' a; head -c 50000 /dev/zero | tr '\\0' b"})
	out = decodeText[mcpCommandOut](t, text)
	if !out.Truncated || len(out.Stdout) > 17<<10 || !strings.Contains(out.Stdout, "bytes truncated; full output: "+out.OutputURI) ||
		!strings.HasPrefix(out.Stdout, strings.Repeat("a", 8192)) || !strings.HasSuffix(out.Stdout, strings.Repeat("b", 8192)) {
		t.Errorf("truncated command_run: truncated=%v len=%d %q…", out.Truncated, len(out.Stdout), tail(out.Stdout, 200))
	}
	if c, err := readResource(t, ctx, alpha, out.OutputURI); err != nil || c.Text != strings.Repeat("a", 50000)+strings.Repeat("b", 50000) {
		t.Errorf("full output resource: %d bytes, %v", len(c.Text), err)
	}

	// Files: write, read, list, read as a resource, binary content.
	call(t, ctx, alpha, "file_write", map[string]any{"sandbox_id": id, "path": "/home/user/work/notes.txt", "content": "first version\n"})
	if text, _ = call(t, ctx, alpha, "file_read", map[string]any{"sandbox_id": id, "path": "/home/user/work/notes.txt"}); text != "first version\n" {
		t.Errorf("file_read: %q", text)
	}
	if text, _ = call(t, ctx, alpha, "file_list", map[string]any{"sandbox_id": id, "path": "/home/user/work"}); !strings.Contains(text, `"/home/user/work/notes.txt"`) {
		t.Errorf("file_list: %s", text)
	}
	fileRes := "space://sandboxes/" + id + "/files/home/user/work/notes.txt"
	if c, err := readResource(t, ctx, alpha, fileRes); err != nil || c.Text != "first version\n" {
		t.Errorf("file resource: %+v %v", c, err)
	}
	bin := []byte{0, 1, 2, 0xff, 0xfe, 'x'}
	call(t, ctx, alpha, "file_write", map[string]any{"sandbox_id": id, "path": "/home/user/work/blob", "content": base64.StdEncoding.EncodeToString(bin), "encoding": "base64"})
	_, res := call(t, ctx, alpha, "file_read", map[string]any{"sandbox_id": id, "path": "/home/user/work/blob"})
	if er, ok := res.Content[0].(*mcp.EmbeddedResource); !ok || !bytes.Equal(er.Resource.Blob, bin) {
		t.Errorf("binary file_read: %#v", res.Content[0])
	}

	// code_run: printed output and the value of the last expression (a
	// str's text without its quotes, as E2B gives it).
	text, res = call(t, ctx, alpha, "code_run", map[string]any{"sandbox_id": id, "code": "import os\nprint('sum', 1+1)\nos.environ['X'] + '!'", "env": map[string]string{"X": "value"}})
	if !strings.Contains(text, "sum 2") || !strings.Contains(text, "value!") {
		t.Errorf("code_run: %q", text)
	}
	msg := callErr(t, ctx, alpha, "code_run", map[string]any{"sandbox_id": id, "code": "1/0"})
	if !strings.Contains(msg, "ZeroDivisionError") {
		t.Errorf("code_run raising: %q", msg)
	}

	// snapshot_create, change the file, file_restore brings it back.
	text, _ = call(t, ctx, alpha, "snapshot_create", map[string]any{"sandbox_id": id, "name": "before-edit"})
	snap := decodeText[struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}](t, text)
	if snap.ID == "" || snap.Status != "ready" {
		t.Fatalf("snapshot_create: %s", text)
	}
	call(t, ctx, alpha, "file_write", map[string]any{"sandbox_id": id, "path": "/home/user/work/notes.txt", "content": "ruined\n"})
	call(t, ctx, alpha, "file_restore", map[string]any{"sandbox_id": id, "snapshot_id": snap.ID, "paths": []string{"/home/user/work/notes.txt"}})
	if text, _ = call(t, ctx, alpha, "file_read", map[string]any{"sandbox_id": id, "path": "/home/user/work/notes.txt"}); text != "first version\n" {
		t.Errorf("file after file_restore: %q", text)
	}

	// sandbox_fork: the child has the parent's files.
	text, _ = call(t, ctx, alpha, "sandbox_fork", map[string]any{"sandbox_id": id})
	forked := decodeText[struct {
		Sandboxes []struct {
			ID string `json:"id"`
		} `json:"sandboxes"`
	}](t, text)
	if len(forked.Sandboxes) != 1 {
		t.Fatalf("sandbox_fork: %s", text)
	}
	child := forked.Sandboxes[0].ID
	if text, _ = call(t, ctx, alpha, "file_read", map[string]any{"sandbox_id": child, "path": "/home/user/work/notes.txt"}); text != "first version\n" {
		t.Errorf("file in the fork's child: %q", text)
	}

	// Team isolation: beta's key finds none of alpha's sandboxes.
	for _, tc := range []struct {
		tool string
		args map[string]any
	}{
		{"command_run", map[string]any{"sandbox_id": id, "command": "true"}},
		{"file_read", map[string]any{"sandbox_id": id, "path": "/home/user/work/notes.txt"}},
		{"file_write", map[string]any{"sandbox_id": id, "path": "/tmp/x", "content": "x"}},
		{"file_list", map[string]any{"sandbox_id": id, "path": "/tmp"}},
		{"code_run", map[string]any{"sandbox_id": id, "code": "1"}},
		{"snapshot_create", map[string]any{"sandbox_id": id}},
		{"file_restore", map[string]any{"sandbox_id": id, "snapshot_id": snap.ID, "paths": []string{"/tmp"}}},
		{"sandbox_fork", map[string]any{"sandbox_id": id}},
		{"sandbox_kill", map[string]any{"sandbox_id": child}},
	} {
		if msg := callErr(t, ctx, beta, tc.tool, tc.args); !strings.Contains(msg, "not found") {
			t.Errorf("team beta %s on alpha's sandbox: %q, want not found", tc.tool, msg)
		}
	}
	for _, uri := range []string{fileRes, out.OutputURI} {
		if _, err := readResource(t, ctx, beta, uri); err == nil {
			t.Errorf("team beta read alpha's resource %s", uri)
		}
	}

	// Bad input: clear tool errors, nothing run.
	for _, tc := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"command_run", map[string]any{"sandbox_id": id}, "command"},
		{"command_run", map[string]any{"sandbox_id": id, "command": "true", "timeout_s": 99999}, "timeout_s"},
		{"command_run", map[string]any{"sandbox_id": id, "command": "true", "cwd": "relative"}, "absolute"},
		{"command_run", map[string]any{"sandbox_id": 12, "command": "true"}, "sandbox_id"},
		{"command_run", map[string]any{"sandbox_id": "sb-doesnotexist", "command": "true"}, "not found"},
		{"file_read", map[string]any{"sandbox_id": id, "path": "etc/passwd"}, "absolute"},
		{"file_read", map[string]any{"sandbox_id": id, "path": "/tmp/none"}, "no such file"},
		{"file_write", map[string]any{"sandbox_id": id, "path": "/tmp/x", "content": "%%%", "encoding": "base64"}, "base64"},
		{"file_write", map[string]any{"sandbox_id": id, "path": "/tmp/x", "content": "x", "encoding": "rot13"}, "encoding"},
		{"code_run", map[string]any{"sandbox_id": id, "code": "1", "language": "cobol"}, "not supported"},
		{"file_restore", map[string]any{"sandbox_id": id, "snapshot_id": snap.ID, "paths": []string{}}, "paths"},
		{"sandbox_fork", map[string]any{"sandbox_id": id, "count": 1000}, "count"},
		{"sandbox_create", map[string]any{"template": "no-such-template"}, "template"},
		{"sandbox_create", map[string]any{"network_allow": []string{"not a host!"}}, "invalid"},
		{"sandbox_kill", map[string]any{}, "sandbox_id"},
	} {
		if msg := callErr(t, ctx, alpha, tc.tool, tc.args); !strings.Contains(strings.ToLower(msg), tc.want) {
			t.Errorf("%s(%v): %q, want it to mention %q", tc.tool, tc.args, msg, tc.want)
		}
	}
	if _, err := readResource(t, ctx, alpha, "space://sandboxes/"+id+"/commands/999999/output"); err == nil {
		t.Error("output of a pid never started: no error")
	}

	// sandbox_kill: gone from the running list.
	call(t, ctx, alpha, "sandbox_kill", map[string]any{"sandbox_id": child})
	call(t, ctx, alpha, "sandbox_kill", map[string]any{"sandbox_id": id})
	if text, _ = call(t, ctx, alpha, "sandbox_list", map[string]any{"state": []string{"running"}}); strings.Contains(text, id) {
		t.Errorf("killed sandbox still running: %s", text)
	}
}

// TestMCPCodeImage: a matplotlib chart comes back from code_run as MCP
// image content (a PNG), in the python-data template.
func TestMCPCodeImage(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real sandboxes")
	}
	s := startServer(t, "")
	s.buildTemplate("python-data")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cs := mcpConnect(t, ctx, s, s.teamKey("alpha"))
	text, _ := call(t, ctx, cs, "sandbox_create", map[string]any{"template": "python-data"})
	id := decodeText[struct{ ID string }](t, text).ID
	_, res := call(t, ctx, cs, "code_run", map[string]any{"sandbox_id": id, "code": "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()"})
	var png []byte
	for _, c := range res.Content {
		if img, ok := c.(*mcp.ImageContent); ok && img.MIMEType == "image/png" {
			png = img.Data
		}
	}
	if !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) {
		t.Fatalf("code_run with a chart: no PNG image in %d contents (%q)", len(res.Content), contentText(res))
	}
}

// TestMCPStdio: `space mcp` as a subprocess (what a local agent starts)
// serves the same tools over stdio against the server given by SPACE_URL
// and SPACE_API_KEY.
func TestMCPStdio(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real sandboxes")
	}
	s := startServer(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.Command(spaceBin(t), "mcp")
	cmd.Env = append(os.Environ(), "SPACE_URL="+s.url, "SPACE_API_KEY="+s.teamKey("alpha"))
	cmd.Stderr = os.Stderr
	c := mcp.NewClient(&mcp.Implementation{Name: "space-e2e", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect to space mcp: %v", err)
	}
	defer cs.Close()
	tl, err := cs.ListTools(ctx, nil)
	if err != nil || len(tl.Tools) != 11 {
		t.Fatalf("tools over stdio: %v %v", tl, err)
	}
	text, _ := call(t, ctx, cs, "sandbox_create", nil)
	id := decodeText[struct{ ID string }](t, text).ID
	text, _ = call(t, ctx, cs, "command_run", map[string]any{"sandbox_id": id, "command": "echo over stdio"})
	if out := decodeText[mcpCommandOut](t, text); out.Stdout != "over stdio\n" || out.ExitCode != 0 {
		t.Errorf("command_run over stdio: %+v", out)
	}
	// The key is the team's: the sandbox is alpha's.
	var sbx struct{ Sandboxes []struct{ ID string } }
	s.do("GET", "/v1/sandboxes", s.teamKey("beta"), nil, &sbx)
	for _, x := range sbx.Sandboxes {
		if x.ID == id {
			t.Errorf("team beta sees the sandbox made over stdio with alpha's key")
		}
	}
	call(t, ctx, cs, "sandbox_kill", map[string]any{"sandbox_id": id})

	// A wrong key: said on stderr at start; the tools answer the API's
	// 401 as tool errors.
	bad := exec.Command(spaceBin(t), "mcp")
	bad.Env = append(os.Environ(), "SPACE_URL="+s.url, "SPACE_API_KEY=sk_space_wrong")
	var stderr bytes.Buffer
	bad.Stderr = &stderr
	bcs, err := c.Connect(ctx, &mcp.CommandTransport{Command: bad}, nil)
	if err != nil {
		t.Fatalf("connect to space mcp with a wrong key: %v", err)
	}
	if msg := callErr(t, ctx, bcs, "sandbox_list", nil); !strings.Contains(msg, "invalid API key") {
		t.Errorf("sandbox_list with a wrong key: %q", msg)
	}
	bcs.Close()
	if !strings.Contains(stderr.String(), "space mcp: warning: "+s.url) || !strings.Contains(stderr.String(), "invalid API key") {
		t.Errorf("stderr of space mcp with a wrong key: %q", stderr.String())
	}
}

// TestMCPTypeScriptSDK: the official MCP TypeScript SDK client (pinned in
// e2e/mcp/package.json) lists the tools, runs a command in a new sandbox
// and reads its output resource over /mcp (e2e/mcp/client.mjs).
func TestMCPTypeScriptSDK(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real sandboxes and Node")
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node not found on PATH: %v", err)
	}
	dir, err := filepath.Abs("mcp")
	if err != nil {
		t.Fatal(err)
	}
	npmInstallFor(t, dir, "@modelcontextprotocol/sdk")
	s := startServer(t, "")
	cmd := exec.Command(node, "client.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "SPACE_URL="+s.url, "SPACE_API_KEY="+s.teamKey("alpha"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if err != nil {
		t.Fatalf("client.mjs: %v\n%s", err, stderr.String())
	}
	var got struct {
		Tools      []string      `json:"tools"`
		Run        mcpCommandOut `json:"run"`
		Resource   string        `json:"resource"`
		BadIsError bool          `json:"badIsError"`
		BadText    string        `json:"badText"`
	}
	if err := json.Unmarshal(stdout, &got); err != nil {
		t.Fatalf("client.mjs printed %q: %v", stdout, err)
	}
	if len(got.Tools) != 11 || !slices.Contains(got.Tools, "command_run") || !slices.Contains(got.Tools, "code_run") {
		t.Errorf("tools seen by the TypeScript client: %v", got.Tools)
	}
	if got.Run.Stdout != "from typescript\nLinux\n" || got.Run.ExitCode != 0 || got.Resource != got.Run.Stdout {
		t.Errorf("command_run from TypeScript: %+v, resource %q", got.Run, got.Resource)
	}
	if !got.BadIsError || !strings.Contains(got.BadText, "command") {
		t.Errorf("command_run without a command from TypeScript: isError=%v %q", got.BadIsError, got.BadText)
	}
}

// TestMCPAcrossRestart: /mcp keeps no session in the server, so a client
// connected before a restart goes on calling tools after it.
func TestMCPAcrossRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real sandboxes")
	}
	s := startServer(t, "", "--listen", freeAddr(t))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	key := s.teamKey("alpha")
	cs := mcpConnect(t, ctx, s, key)
	call(t, ctx, cs, "sandbox_list", nil)
	url := s.url
	s.stop(false)
	s.start()
	if s.url != url {
		t.Fatalf("restarted on %s, not %s", s.url, url)
	}
	if text, _ := call(t, ctx, cs, "sandbox_list", nil); !strings.Contains(text, `"sandboxes"`) {
		t.Errorf("sandbox_list after the restart: %s", text)
	}
}

// BenchmarkMCP compares a `true` command through /mcp (command_run, the
// Go SDK's client over HTTP, then /v1 in process) with the same exec on
// /v1 directly, and file_read with GET /files, on one sandbox:
//
//	go test ./e2e/ -run '^$' -bench BenchmarkMCP -benchtime 50x
func BenchmarkMCP(b *testing.B) {
	s := startServer(b, "")
	ctx := context.Background()
	key := s.teamKey("alpha")
	c := mcp.NewClient(&mcp.Implementation{Name: "space-bench", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: s.url + "/mcp", HTTPClient: &http.Client{Transport: bearer{key}}}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer cs.Close()
	api := space.NewClient(s.url, key)
	sb, err := api.CreateSandbox(ctx, space.CreateSandboxRequest{TimeoutS: 600})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := api.WriteFile(ctx, sb.ID, "/home/user/f.txt", strings.NewReader("hello")); err != nil {
		b.Fatal(err)
	}
	tool := func(name string, args map[string]any) func(*testing.B) {
		return func(b *testing.B) {
			for b.Loop() {
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
				if err != nil || res.IsError {
					b.Fatalf("%s: %v %v", name, err, res)
				}
			}
		}
	}
	b.Run("v1_exec_true", func(b *testing.B) {
		for b.Loop() {
			if _, err := api.Exec(ctx, sb.ID, space.ExecRequest{Shell: "true"}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("v1_exec_true_timeout_60s", func(b *testing.B) { // what command_run sends
		for b.Loop() {
			if _, err := api.Exec(ctx, sb.ID, space.ExecRequest{Shell: "true", TimeoutS: 60}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("mcp_command_run_true", tool("command_run", map[string]any{"sandbox_id": sb.ID, "command": "true"}))
	b.Run("v1_read_file", func(b *testing.B) {
		for b.Loop() {
			rc, err := api.ReadFile(ctx, sb.ID, "/home/user/f.txt")
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, rc)
			rc.Close()
		}
	})
	b.Run("mcp_file_read", tool("file_read", map[string]any{"sandbox_id": sb.ID, "path": "/home/user/f.txt"}))
}
