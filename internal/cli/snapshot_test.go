package cli

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	space "github.com/spacesandbox/space/sdk/go"
)

// snapServer implements the snapshot endpoints the way the real server
// does, for sandbox sb_1 with snapshots snap-a and snap-b and sandbox sb_2
// with snap-c. Request bodies are recorded in bodies by "METHOD path".
func snapServer(t *testing.T, bodies map[string]map[string]any) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	auth := func(h http.HandlerFunc) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "Bearer admin-key" {
				writeErr(w, 401, "unauthenticated", "missing or invalid API key")
				return
			}
			if r.Method == "POST" {
				var body map[string]any
				json.NewDecoder(r.Body).Decode(&body)
				bodies[r.Method+" "+r.URL.Path] = body
			}
			h(w, r)
		}
	}
	snaps := map[string]map[string]any{
		"snap-a": {"id": "snap-a", "sandbox_id": "sb_1", "kind": "checkpoint", "automatic": true, "status": "ready",
			"template": "base", "created_at": "2025-01-02T03:04:05Z", "bytes_new": 2048, "bytes_total": 2048},
		"snap-b": {"id": "snap-b", "sandbox_id": "sb_1", "kind": "files", "name": "v2", "automatic": false, "status": "failed",
			"error": "disk full", "parent": "snap-a", "template": "base", "created_at": "2025-01-02T03:05:05Z", "bytes_new": 0, "bytes_total": 0},
		"snap-c": {"id": "snap-c", "sandbox_id": "sb_2", "kind": "files", "status": "ready"},
	}
	mux.HandleFunc("POST /v1/sandboxes", auth(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 201, map[string]any{"id": "sb_9", "state": "running"})
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/pause", auth(func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") == "sb_p" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(409)
			io.WriteString(w, `{"code":409,"error":"conflict","message":"sandbox is paused","state":"paused"}`)
			return
		}
		writeJSON(w, 200, map[string]any{"id": r.PathValue("id"), "state": "paused"})
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/resume", auth(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, map[string]any{"id": r.PathValue("id"), "state": "running"})
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/snapshots", auth(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 201, map[string]any{"id": "snap-new", "sandbox_id": r.PathValue("id"), "kind": "checkpoint",
			"status": "ready", "bytes_new": 1536, "bytes_total": 3 << 20})
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}/snapshots", auth(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, map[string]any{"snapshots": []any{snaps["snap-a"], snaps["snap-b"]}})
	}))
	mux.HandleFunc("GET /v1/snapshots/diff", auth(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		writeJSON(w, 200, map[string]any{"from": q.Get("from"), "to": q.Get("to"), "changes": []any{
			map[string]any{"path": "/home/user/a.txt", "kind": "modified", "type": "file", "old_size": 3, "new_size": 13},
			map[string]any{"path": "/home/user/new", "kind": "added", "type": "dir"},
			map[string]any{"path": "/home/user/new/b", "kind": "added", "type": "file", "new_size": 5},
			map[string]any{"path": "/tmp/x", "kind": "removed", "type": "file", "old_size": 7},
		}})
	}))
	mux.HandleFunc("GET /v1/snapshots/{sid}", auth(func(w http.ResponseWriter, r *http.Request) {
		sn, ok := snaps[r.PathValue("sid")]
		if !ok {
			writeErr(w, 404, "not_found", "snapshot "+r.PathValue("sid")+" not found")
			return
		}
		writeJSON(w, 200, sn)
	}))
	mux.HandleFunc("DELETE /v1/snapshots/{sid}", auth(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := snaps[r.PathValue("sid")]; !ok {
			writeErr(w, 404, "not_found", "snapshot "+r.PathValue("sid")+" not found")
			return
		}
		w.WriteHeader(204)
	}))
	mux.HandleFunc("GET /v1/snapshots/{sid}/files", auth(func(w http.ResponseWriter, r *http.Request) {
		switch p := r.URL.Query().Get("path"); p {
		case "/home/user/a.txt":
			w.Header().Set("Content-Type", "application/octet-stream")
			io.WriteString(w, "old\n")
		case "/home/user":
			writeJSON(w, 200, map[string]any{"entries": []any{
				map[string]any{"path": "/home/user/a.txt", "name": "a.txt", "type": "file", "size": 4, "mode": 0o644, "mtime": "2025-01-02T03:04:05Z"},
				map[string]any{"path": "/home/user/d", "name": "d", "type": "dir", "size": 0, "mode": 0o755, "mtime": "2025-01-02T03:04:05Z"},
				map[string]any{"path": "/home/user/l", "name": "l", "type": "symlink", "size": 5, "mode": 0o777, "mtime": "2025-01-02T03:04:05Z", "target": "a.txt"},
			}})
		default:
			writeErr(w, 404, "not_found", p+": not in snapshot")
		}
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/restore", auth(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, map[string]any{"written": []string{"/home/user/a.txt"}, "removed": []string{"/home/user/new"}})
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/fork", auth(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 201, map[string]any{"sandboxes": []any{map[string]any{"id": "sb_k1", "state": "running"}, map[string]any{"id": "sb_k2", "state": "running"}}})
	}))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func TestCLISnapshotVerbs(t *testing.T) {
	bodies := map[string]map[string]any{}
	srv := snapServer(t, bodies)
	tests := []struct {
		name      string
		args      []string
		code      int
		out, errs string
		path      string         // request whose body is checked
		body      map[string]any // expected body of path
	}{
		{"pause", []string{"pause", "sb_1", "sb_p"}, 1, "sb_1 paused\n", "space: sb_p: sandbox is paused (state paused)\n", "", nil},
		{"resume", []string{"resume", "sb_1"}, 0, "sb_1 running\n", "", "", nil},
		{"snapshot", []string{"snapshot", "sb_1", "--name", "v1"}, 0, "snap-new (checkpoint, 1.5KiB new, 3.0MiB total)\n", "",
			"POST /v1/sandboxes/sb_1/snapshots", map[string]any{"kind": "checkpoint", "name": "v1"}},
		{"snapshot files quiet", []string{"snapshot", "sb_1", "--files", "-q"}, 0, "snap-new\n", "",
			"POST /v1/sandboxes/sb_1/snapshots", map[string]any{"kind": "files"}},
		{"diff", []string{"diff", "sb_1", "snap-a", "snap-b"}, 0,
			"M /home/user/a.txt (3 → 13 bytes)\nA /home/user/new (dir)\nA /home/user/new/b (5 bytes)\nD /tmp/x (7 bytes)\n", "", "", nil},
		{"diff without id", []string{"diff", "snap-a", "snap-c"}, 0,
			"M /home/user/a.txt (3 → 13 bytes)\nA /home/user/new (dir)\nA /home/user/new/b (5 bytes)\nD /tmp/x (7 bytes)\n", "", "", nil},
		{"diff wrong sandbox", []string{"diff", "sb_1", "snap-a", "snap-c"}, 1, "", "space: snapshot snap-c belongs to sandbox sb_2, not sb_1\n", "", nil},
		{"diff missing snapshot", []string{"diff", "sb_1", "snap-a", "snap-z"}, 1, "", "space: snapshot snap-z not found\n", "", nil},
		{"restore paths", []string{"restore", "sb_1", "--snapshot", "snap-a", "/home/user/a.txt", "/home/user/new"}, 0,
			"restored /home/user/a.txt\nremoved /home/user/new\n", "",
			"POST /v1/sandboxes/sb_1/restore", map[string]any{"snapshot": "snap-a", "paths": []any{"/home/user/a.txt", "/home/user/new"}}},
		{"restore all", []string{"restore", "sb_1", "--snapshot", "snap-a"}, 0,
			"restored /home/user/a.txt\nremoved /home/user/new\n", "",
			"POST /v1/sandboxes/sb_1/restore", map[string]any{"snapshot": "snap-a"}},
		{"restore needs snapshot", []string{"restore", "sb_1"}, 1, "",
			"space: give --snapshot or --before (usage: space restore <id> (--snapshot <sid> | --before <command-id>) [paths...] [flags])\n", "", nil},
		{"cat file", []string{"snapshot-cat", "snap-a", "/home/user/a.txt"}, 0, "old\n", "", "", nil},
		{"cat missing", []string{"snapshot-cat", "snap-a", "/nope"}, 1, "", "space: /nope: not in snapshot\n", "", nil},
		{"rm", []string{"snapshot-rm", "snap-a", "snap-z", "snap-b"}, 1, "", "space: snap-z: snapshot snap-z not found\n", "", nil},
		{"fork", []string{"fork", "sb_1", "--count", "2", "--snapshot", "snap-a"}, 0, "sb_k1\nsb_k2\n", "",
			"POST /v1/sandboxes/sb_1/fork", map[string]any{"count": 2.0, "snapshot": "snap-a"}},
		{"create from snapshot", []string{"create", "--from-snapshot", "snap-a", "--on-timeout", "pause", "--timeout", "60"}, 0, "sb_9\n", "",
			"POST /v1/sandboxes", map[string]any{"snapshot": "snap-a", "on_timeout": "pause", "timeout_s": 60.0}},
		{"create from snapshot and template", []string{"create", "--from-snapshot", "snap-a", "--template", "py"}, 1, "",
			"space: give --template or --from-snapshot, not both (usage: space create [flags])\n", "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clear(bodies)
			code, out, errOut := runCLI(t, srv, "", tt.args...)
			if code != tt.code || out != tt.out || errOut != tt.errs {
				t.Fatalf("code %d stdout %q stderr %q; want %d %q %q", code, out, errOut, tt.code, tt.out, tt.errs)
			}
			if tt.path != "" && !reflect.DeepEqual(bodies[tt.path], tt.body) {
				t.Fatalf("%s body = %v, want %v", tt.path, bodies[tt.path], tt.body)
			}
		})
	}
}

func TestCLISnapshotsTable(t *testing.T) {
	srv := snapServer(t, map[string]map[string]any{})
	code, out, errOut := runCLI(t, srv, "", "snapshots", "sb_1")
	if code != 0 || errOut != "" {
		t.Fatalf("code %d stderr %q", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 {
		t.Fatalf("output %q", out)
	}
	for i, want := range [][]string{
		{"ID", "KIND", "NAME", "AUTO", "CREATED", "NEW", "TOTAL", "STATUS"},
		{"snap-a", "checkpoint", "-", "yes", "2.0KiB", "2.0KiB", "ready"},
		{"snap-b", "files", "v2", "no", "0B", "0B", "failed", "(disk", "full)"},
	} {
		f := strings.Fields(lines[i])
		if i > 0 { // drop the local-time CREATED column (date and time)
			f = append(f[:4], f[6:]...)
		}
		if !reflect.DeepEqual(f, want) {
			t.Errorf("line %d = %q, want fields %q", i, lines[i], want)
		}
	}
	code, out, _ = runCLI(t, srv, "", "snapshots", "sb_1", "--json")
	var snaps []space.Snapshot
	if code != 0 || json.Unmarshal([]byte(out), &snaps) != nil || len(snaps) != 2 || snaps[1].Error != "disk full" {
		t.Fatalf("json: %d %q", code, out)
	}
}

func TestCLISnapshotCatDir(t *testing.T) {
	srv := snapServer(t, map[string]map[string]any{})
	code, out, errOut := runCLI(t, srv, "", "snapshot-cat", "snap-a", "/home/user")
	if code != 0 || errOut != "" {
		t.Fatalf("code %d stderr %q", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	want := []string{"MODE SIZE MODIFIED NAME", "-rw-r--r-- 4 a.txt", "drwxr-xr-x 0 d/", "Lrwxrwxrwx 5 l -> a.txt"}
	if len(lines) != len(want) {
		t.Fatalf("output %q", out)
	}
	for i, l := range lines {
		f := strings.Fields(l)
		if i > 0 {
			f = append(f[:2], f[4:]...)
		}
		if strings.Join(f, " ") != want[i] {
			t.Errorf("line %d = %q, want %q", i, l, want[i])
		}
	}
}

func TestFmtChange(t *testing.T) {
	tests := []struct {
		in   space.Change
		want string
	}{
		{space.Change{Path: "/a", Kind: "modified", Type: "file", OldSize: 3, NewSize: 13}, "M /a (3 → 13 bytes)"},
		{space.Change{Path: "/a", Kind: "added", Type: "file", NewSize: 13}, "A /a (13 bytes)"},
		{space.Change{Path: "/a", Kind: "removed", Type: "file", OldSize: 3}, "D /a (3 bytes)"},
		{space.Change{Path: "/l", Kind: "modified", Type: "symlink"}, "M /l (symlink)"},
		{space.Change{Path: "/x", Kind: "weird", Type: "file"}, "? /x (0 → 0 bytes)"},
	}
	for _, tt := range tests {
		if got := fmtChange(tt.in); got != tt.want {
			t.Errorf("fmtChange(%+v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
