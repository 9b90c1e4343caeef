package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
)

type fileVersionView struct {
	Snapshot  string `json:"snapshot"`
	Template  bool   `json:"template"`
	CommandID int64  `json:"command_id"`
	Command   string `json:"command"`
	Deleted   bool   `json:"deleted"`
	Type      string `json:"type"`
	Size      int64  `json:"size"`
	SHA256    string `json:"sha256"`
}

type fileDiffView struct {
	FromExists bool   `json:"from_exists"`
	ToExists   bool   `json:"to_exists"`
	Binary     bool   `json:"binary"`
	Same       bool   `json:"same"`
	Diff       string `json:"diff"`
}

// TestFileHistory: a sandbox created with snapshot_on_exec gets a snapshot
// after each command that changed files, naming the command; ten commands
// that each rewrite one file give that file ten versions, each naming its
// command; a command that changes nothing adds no snapshot; restore
// --before command 5 brings back version 4, --before command 1 removes the
// file (it did not exist then); a diff of two versions is a unified diff,
// of a binary file says so. Paths are validated; another team's sandbox is
// not found.
func TestFileHistory(t *testing.T) {
	s := sharedServer(t)
	id := s.create(map[string]any{"snapshot_on_exec": true})
	defer s.do("DELETE", "/v1/sandboxes/"+id, s.key, nil, nil)
	const file = "/home/user/h.txt"
	var answered []int64 // the command ids the exec answers gave
	for i := 1; i <= 9; i++ {
		r := s.sh(id, fmt.Sprintf("echo v%d > %s", i, file))
		if r.ExitCode != 0 {
			t.Fatalf("command %d: %+v", i, r)
		}
		answered = append(answered, r.CommandID)
	}
	// The tenth streamed (SSE): its exit event names it.
	resp := s.stream("POST", "/v1/sandboxes/"+id+"/exec", map[string]any{"cmd": fmt.Sprintf("echo v10 > %s", file)}, nil)
	var exit struct {
		ExitCode  int   `json:"exit_code"`
		CommandID int64 `json:"command_id"`
	}
	readSSE(t, resp.Body, func(e sseEvent) bool {
		if e.Event == "exit" {
			json.Unmarshal([]byte(e.Data), &exit)
		}
		return true
	})
	resp.Body.Close()
	answered = append(answered, exit.CommandID)
	timeline := func() []snapshotView {
		var tl struct{ Snapshots []snapshotView }
		if code := s.do("GET", "/v1/sandboxes/"+id+"/snapshots", s.key, nil, &tl); code != 200 {
			t.Fatalf("timeline: %d", code)
		}
		return tl.Snapshots
	}
	before := len(timeline())
	// One baseline before the first command, one after each of the ten.
	if before != 11 {
		t.Errorf("timeline after ten changing commands: %d snapshots, want 11", before)
	}
	if r := s.sh(id, "cat "+file+" >/dev/null; true"); r.ExitCode != 0 {
		t.Fatalf("read-only command: %+v", r)
	}
	if n := len(timeline()); n != before {
		t.Errorf("a command that changed nothing: %d snapshots, want %d", n, before)
	}

	var cmds struct{ Commands []commandView }
	if code := s.do("GET", "/v1/sandboxes/"+id+"/commands", s.key, nil, &cmds); code != 200 || len(cmds.Commands) != 11 {
		t.Fatalf("commands: %d %+v", code, cmds)
	}
	ids := make([]int64, len(cmds.Commands))
	for i, c := range cmds.Commands {
		ids[i] = c.ID
		if c.ID == 0 || i > 0 && c.ID <= ids[i-1] {
			t.Fatalf("command ids not increasing: %+v", cmds.Commands)
		}
		if i < len(answered) && answered[i] != c.ID {
			t.Errorf("exec %d answered command_id %d; the command list says %d", i+1, answered[i], c.ID)
		}
	}

	var hist struct {
		Path     string
		Versions []fileVersionView
	}
	if code := s.do("GET", "/v1/sandboxes/"+id+"/files/history?path="+url.QueryEscape(file), s.key, nil, &hist); code != 200 {
		t.Fatalf("history: %d", code)
	}
	if len(hist.Versions) != 10 {
		t.Fatalf("history: %d versions, want 10: %+v", len(hist.Versions), hist.Versions)
	}
	snapOf := map[int]string{} // version number → snapshot
	for i, v := range hist.Versions {
		content := fmt.Sprintf("v%d\n", i+1)
		sum := sha256.Sum256([]byte(content))
		if v.CommandID != ids[i] || !strings.Contains(v.Command, fmt.Sprintf("echo v%d ", i+1)) || v.Type != "file" ||
			v.Size != int64(len(content)) || v.SHA256 != hex.EncodeToString(sum[:]) || v.Snapshot == "" || v.Deleted {
			t.Errorf("version %d = %+v, want command %d and sha256 of %q", i+1, v, ids[i], content)
		}
		snapOf[i+1] = v.Snapshot
	}
	// The timeline names the commands too.
	for _, sn := range timeline() {
		if sn.ID == snapOf[3] && (sn.CommandID != ids[2] || !strings.Contains(sn.Cause, "echo v3")) {
			t.Errorf("snapshot after command 3 = %+v", sn)
		}
	}

	read := func() (int, string) {
		resp, err := s.get(id, file)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	var res struct {
		Snapshot string
		Written  []string
		Removed  []string
	}
	if code := s.do("POST", "/v1/sandboxes/"+id+"/restore", s.key, map[string]any{"before_command": ids[4], "paths": []string{file}}, &res); code != 200 {
		t.Fatalf("restore before command 5: %d %+v", code, res)
	}
	if code, body := read(); code != 200 || body != "v4\n" {
		t.Errorf("after restore --before command 5: %d %q, want version 4", code, body)
	}
	if res.Snapshot != snapOf[4] {
		t.Errorf("restored from %s, want %s (version 4's)", res.Snapshot, snapOf[4])
	}
	if code := s.do("POST", "/v1/sandboxes/"+id+"/restore", s.key, map[string]any{"before_command": ids[0], "paths": []string{file}}, &res); code != 200 || len(res.Removed) != 1 {
		t.Fatalf("restore before command 1: %d %+v", code, res)
	}
	if code, _ := read(); code != 404 {
		t.Errorf("before command 1 the file did not exist; after the restore: %d", code)
	}

	var d fileDiffView
	q := "/v1/snapshots/diff?from=" + snapOf[3] + "&to=" + snapOf[7] + "&path=" + url.QueryEscape(file)
	if code := s.do("GET", q, s.key, nil, &d); code != 200 {
		t.Fatalf("diff: %d", code)
	}
	if !d.FromExists || !d.ToExists || d.Binary || d.Same || !strings.Contains(d.Diff, "-v3\n") || !strings.Contains(d.Diff, "+v7\n") ||
		!strings.Contains(d.Diff, "--- a"+file) {
		t.Errorf("diff v3 → v7 = %+v", d)
	}
	s.sh(id, "printf 'a\\000b' > /home/user/b.bin")
	tl := timeline()
	last := tl[len(tl)-1].ID
	if code := s.do("GET", "/v1/snapshots/diff?from="+snapOf[10]+"&to="+last+"&path=/home/user/b.bin", s.key, nil, &d); code != 200 || !d.Binary || d.FromExists || !d.ToExists || d.Diff != "" {
		t.Errorf("diff of a new binary file: %d %+v", code, d)
	}

	// Validation, and tenancy.
	var e apiError
	for _, p := range []string{"", "/home/../etc/passwd", "/"} {
		if code := s.do("GET", "/v1/sandboxes/"+id+"/files/history?path="+url.QueryEscape(p), s.key, nil, &e); code != 400 || e.Message == "" {
			t.Errorf("history of %q: %d %+v", p, code, e)
		}
	}
	if code := s.do("POST", "/v1/sandboxes/"+id+"/restore", s.key, map[string]any{"before_command": ids[4], "snapshot": snapOf[1]}, &e); code != 400 {
		t.Errorf("restore with both snapshot and before_command: %d", code)
	}
	if code := s.do("POST", "/v1/sandboxes/"+id+"/restore", s.key, map[string]any{"before_command": 1 << 40}, &e); code != 404 {
		t.Errorf("restore before an unknown command: %d", code)
	}
	other := s.teamKey("history-other")
	if code := s.do("GET", "/v1/sandboxes/"+id+"/files/history?path="+url.QueryEscape(file), other, nil, &e); code != 404 {
		t.Errorf("another team's history: %d", code)
	}
	if code := s.do("GET", q, other, nil, &e); code != 404 {
		t.Errorf("another team's diff: %d", code)
	}
	if code := s.do("POST", "/v1/sandboxes/"+id+"/restore", other, map[string]any{"before_command": ids[4]}, &e); code != 404 {
		t.Errorf("another team's restore: %d", code)
	}
}

// TestCLIHistory: the CLI's verbs over the same features, against the real
// server: create --snapshot-on-exec, commands (with ids), history, diff
// --path, restore --before.
func TestCLIHistory(t *testing.T) {
	s := sharedServer(t)
	run := func(args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(spaceBin(t), args...)
		cmd.Env = append(os.Environ(), "SPACE_URL="+s.url, "SPACE_API_KEY="+s.key)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		return out.String(), code
	}
	out, code := run("create", "--snapshot-on-exec")
	id := strings.TrimSpace(out)
	if code != 0 || id == "" {
		t.Fatalf("create: %d %q", code, out)
	}
	defer s.do("DELETE", "/v1/sandboxes/"+id, s.key, nil, nil)
	for i := 1; i <= 3; i++ {
		if out, code := run("exec", id, "--", "sh", "-c", fmt.Sprintf("printf 'line\\nv%d\\n' > /home/user/r.txt", i)); code != 0 {
			t.Fatalf("exec %d: %d %q", i, code, out)
		}
	}
	var cmds struct{ Commands []commandView }
	s.do("GET", "/v1/sandboxes/"+id+"/commands", s.key, nil, &cmds)
	if len(cmds.Commands) != 3 {
		t.Fatalf("commands: %+v", cmds)
	}
	if out, _ := run("commands", id); !strings.Contains(out, fmt.Sprint(cmds.Commands[1].ID)) {
		t.Errorf("space commands shows no ids: %q", out)
	}
	out, code = run("history", id, "/home/user/r.txt")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 4 || !strings.Contains(lines[2], "v2") || !strings.Contains(lines[2], fmt.Sprint(cmds.Commands[1].ID)) {
		t.Fatalf("history: %d %q", code, out)
	}
	var vs []struct{ Snapshot string }
	out, _ = run("history", id, "/home/user/r.txt", "--json")
	if err := json.Unmarshal([]byte(out), &vs); err != nil || len(vs) != 3 {
		t.Fatalf("history --json: %v %q", err, out)
	}
	out, code = run("diff", id, vs[0].Snapshot, vs[2].Snapshot, "--path", "/home/user/r.txt")
	if code != 0 || !strings.Contains(out, "-v1\n+v3\n") || !strings.Contains(out, " line\n") {
		t.Errorf("diff --path: %d %q", code, out)
	}
	if out, code := run("restore", id, "--before", fmt.Sprint(cmds.Commands[2].ID), "/home/user/r.txt"); code != 0 || !strings.Contains(out, "restored /home/user/r.txt") {
		t.Errorf("restore --before: %d %q", code, out)
	}
	if r := s.sh(id, "cat /home/user/r.txt"); r.Stdout != "line\nv2\n" {
		t.Errorf("after restore --before the third command: %q", r.Stdout)
	}
}
