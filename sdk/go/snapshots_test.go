package space

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"reflect"
	"testing"
	"time"
)

// snapJSON is a snapshot as the server encodes it.
var snapJSON = map[string]any{"id": "snap-1", "sandbox_id": "sb1", "kind": "files", "name": "v1", "automatic": false,
	"status": "ready", "parent": "snap-0", "template": "base", "created_at": "2025-01-02T03:04:05Z", "bytes_new": 3, "bytes_total": 13}

func TestPauseResume(t *testing.T) {
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.Method + " " + r.URL.Path {
		case "POST /v1/sandboxes/sb1/pause":
			writeJSON(w, 200, map[string]any{"id": "sb1", "state": "paused", "on_timeout": "pause"})
		case "POST /v1/sandboxes/sb1/resume":
			writeJSON(w, 409, map[string]any{"code": 409, "error": "conflict", "message": "sandbox is running", "state": "running"})
		default:
			t.Errorf("got %s %s", r.Method, r.URL.Path)
		}
	})
	sb, err := c.PauseSandbox(t.Context(), "sb1")
	if err != nil || sb.State != StatePaused || sb.OnTimeout != "pause" {
		t.Fatalf("pause: %+v %v", sb, err)
	}
	_, err = c.ResumeSandbox(t.Context(), "sb1")
	var ae *APIError
	if !IsConflict(err) || !errors.As(err, &ae) || ae.State != "running" {
		t.Fatalf("resume: %v", err)
	}
}

func TestCreateAndListSnapshots(t *testing.T) {
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.Method + " " + r.URL.Path {
		case "POST /v1/sandboxes/sb1/snapshots":
			var body map[string]any
			json.NewDecoder(r.Body).Decode(&body)
			if !reflect.DeepEqual(body, map[string]any{"kind": "files", "name": "v1"}) {
				t.Errorf("body = %v", body)
			}
			writeJSON(w, 201, snapJSON)
		case "GET /v1/sandboxes/sb1/snapshots":
			writeJSON(w, 200, map[string]any{"snapshots": []any{map[string]any{"id": "snap-0", "automatic": true, "kind": "checkpoint"}, snapJSON}})
		default:
			t.Errorf("got %s %s", r.Method, r.URL.Path)
		}
	})
	sn, err := c.CreateSnapshot(t.Context(), "sb1", SnapshotRequest{Kind: SnapshotFiles, Name: "v1"})
	if err != nil {
		t.Fatal(err)
	}
	want := Snapshot{ID: "snap-1", SandboxID: "sb1", Kind: "files", Name: "v1", Status: SnapshotReady, Parent: "snap-0",
		Template: "base", CreatedAt: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC), BytesNew: 3, BytesTotal: 13}
	if *sn != want {
		t.Fatalf("got %+v, want %+v", *sn, want)
	}
	list, err := c.ListSnapshots(t.Context(), "sb1")
	if err != nil || len(list) != 2 || list[0].ID != "snap-0" || !list[0].Automatic || list[1] != want {
		t.Fatalf("list: %+v %v", list, err)
	}
}

func TestCreateSnapshotDefaultKind(t *testing.T) {
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if string(b) != "{}" {
			t.Errorf("body = %s, want {} (the server picks checkpoint)", b)
		}
		writeJSON(w, 501, map[string]any{"code": 501, "error": "not_supported", "message": "driver qemu cannot checkpoint"})
	})
	if _, err := c.CreateSnapshot(t.Context(), "sb1", SnapshotRequest{}); !IsNotSupported(err) {
		t.Fatalf("err = %v", err)
	}
}

func TestGetAndDeleteSnapshot(t *testing.T) {
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.Method + " " + r.URL.Path {
		case "GET /v1/snapshots/snap-1":
			v := map[string]any{}
			for k, x := range snapJSON {
				v[k] = x
			}
			if r.URL.RawQuery == "verify=true" {
				v["verified"] = true
			} else if r.URL.RawQuery != "" {
				t.Errorf("query = %q", r.URL.RawQuery)
			}
			writeJSON(w, 200, v)
		case "DELETE /v1/snapshots/snap-1":
			w.WriteHeader(204)
		case "DELETE /v1/snapshots/snap-x":
			writeJSON(w, 404, map[string]any{"code": 404, "error": "not_found", "message": "snapshot \"snap-x\" not found"})
		default:
			t.Errorf("got %s %s", r.Method, r.URL.Path)
		}
	})
	sn, err := c.GetSnapshot(t.Context(), "snap-1", false)
	if err != nil || sn.Verified || sn.BytesTotal != 13 {
		t.Fatalf("get: %+v %v", sn, err)
	}
	sn, err = c.GetSnapshot(t.Context(), "snap-1", true)
	if err != nil || !sn.Verified {
		t.Fatalf("verify: %+v %v", sn, err)
	}
	if err := c.DeleteSnapshot(t.Context(), "snap-1"); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSnapshot(t.Context(), "snap-x"); !IsNotFound(err) {
		t.Fatalf("delete missing: %v", err)
	}
}

func TestSnapshotFiles(t *testing.T) {
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/snapshots/snap-1/files" {
			t.Errorf("path = %s", r.URL.Path)
		}
		switch p := r.URL.Query().Get("path"); p {
		case "/", "/home/user":
			writeJSON(w, 200, map[string]any{"entries": []any{
				map[string]any{"path": "/home/user/a.txt", "name": "a.txt", "type": "file", "size": 5, "mode": 0o644, "mtime": "2025-01-02T03:04:05Z"},
				map[string]any{"path": "/home/user/l", "name": "l", "type": "symlink", "mode": 0o777, "mtime": "2025-01-02T03:04:05Z", "target": "a.txt"},
			}})
		case "/home/user/a.txt":
			w.Header().Set("Content-Type", "application/octet-stream")
			io.WriteString(w, "hello")
		default:
			writeJSON(w, 404, map[string]any{"code": 404, "error": "not_found", "message": p + " not in snapshot"})
		}
	})
	ctx := t.Context()
	rc, err := c.ReadSnapshotFile(ctx, "snap-1", "/home/user/a.txt")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "hello" {
		t.Fatalf("read %q", b)
	}
	if _, err := c.ReadSnapshotFile(ctx, "snap-1", "/home/user"); !errors.Is(err, ErrIsDir) {
		t.Fatalf("read dir: %v", err)
	}
	if _, err := c.ReadSnapshotFile(ctx, "snap-1", "/nope"); !IsNotFound(err) {
		t.Fatalf("read missing: %v", err)
	}
	ents, err := c.ListSnapshotDir(ctx, "snap-1", "")
	if err != nil || len(ents) != 2 {
		t.Fatalf("list root: %+v %v", ents, err)
	}
	want := SnapshotEntry{Path: "/home/user/l", Name: "l", Type: "symlink", Mode: 0o777, MTime: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC), Target: "a.txt"}
	if ents[1] != want || ents[0].Size != 5 || ents[0].IsDir() {
		t.Fatalf("entries %+v", ents)
	}
	if _, err := c.ListSnapshotDir(ctx, "snap-1", "/home/user/a.txt"); !errors.Is(err, ErrNotDir) {
		t.Fatalf("list file: %v", err)
	}
}

func TestDiffRestoreFork(t *testing.T) {
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		if r.Method == "POST" {
			json.NewDecoder(r.Body).Decode(&body)
		}
		switch r.Method + " " + r.URL.Path {
		case "GET /v1/snapshots/diff":
			if q := r.URL.Query(); q.Get("from") != "snap-a" || q.Get("to") != "snap-b" {
				t.Errorf("query = %v", q)
			}
			writeJSON(w, 200, map[string]any{"from": "snap-a", "to": "snap-b", "changes": []any{
				map[string]any{"path": "/a", "kind": "modified", "type": "file", "old_size": 3, "new_size": 13},
				map[string]any{"path": "/b", "kind": "removed", "type": "file", "old_size": 1, "new_size": 0},
			}})
		case "POST /v1/sandboxes/sb1/restore":
			if !reflect.DeepEqual(body, map[string]any{"snapshot": "snap-a", "paths": []any{"/a"}}) {
				t.Errorf("restore body = %v", body)
			}
			writeJSON(w, 200, map[string]any{"written": []string{"/a"}, "removed": []string{}})
		case "POST /v1/sandboxes/sb1/fork":
			if !reflect.DeepEqual(body, map[string]any{"count": 2.0, "snapshot": "snap-a"}) {
				t.Errorf("fork body = %v", body)
			}
			writeJSON(w, 201, map[string]any{"sandboxes": []any{map[string]any{"id": "sb2", "state": "running"}, map[string]any{"id": "sb3", "state": "running"}}})
		default:
			t.Errorf("got %s %s", r.Method, r.URL.Path)
		}
	})
	ctx := t.Context()
	changes, err := c.DiffSnapshots(ctx, "snap-a", "snap-b")
	want := []Change{{Path: "/a", Kind: ChangeModified, Type: "file", OldSize: 3, NewSize: 13}, {Path: "/b", Kind: ChangeRemoved, Type: "file", OldSize: 1}}
	if err != nil || !reflect.DeepEqual(changes, want) {
		t.Fatalf("diff: %+v %v", changes, err)
	}
	res, err := c.RestoreFiles(ctx, "sb1", "snap-a", []string{"/a"})
	if err != nil || !reflect.DeepEqual(res, &RestoreResult{Written: []string{"/a"}, Removed: []string{}}) {
		t.Fatalf("restore: %+v %v", res, err)
	}
	kids, err := c.Fork(ctx, "sb1", ForkRequest{Count: 2, Snapshot: "snap-a"})
	if err != nil || len(kids) != 2 || kids[0].ID != "sb2" || kids[1].State != StateRunning {
		t.Fatalf("fork: %+v %v", kids, err)
	}
}

func TestRestoreAllPathsAndForkDefaults(t *testing.T) {
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/v1/sandboxes/sb1/restore":
			if string(b) != `{"snapshot":"snap-a"}` {
				t.Errorf("restore body = %s", b)
			}
			writeJSON(w, 200, map[string]any{"written": []string{}, "removed": []string{"/new"}})
		case "/v1/sandboxes/sb1/fork":
			if string(b) != `{}` {
				t.Errorf("fork body = %s", b)
			}
			writeJSON(w, 201, map[string]any{"sandboxes": []any{map[string]any{"id": "sb2"}}})
		}
	})
	if res, err := c.RestoreFiles(t.Context(), "sb1", "snap-a", nil); err != nil || len(res.Removed) != 1 {
		t.Fatalf("restore: %+v %v", res, err)
	}
	if kids, err := c.Fork(t.Context(), "sb1", ForkRequest{}); err != nil || len(kids) != 1 {
		t.Fatalf("fork: %+v %v", kids, err)
	}
}

func TestCreateFromSnapshot(t *testing.T) {
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if string(b) != `{"on_timeout":"pause","snapshot":"snap-1"}` {
			t.Errorf("body = %s", b)
		}
		writeJSON(w, 201, map[string]any{"id": "sb9", "state": "running", "on_timeout": "pause"})
	})
	sb, err := c.CreateSandbox(t.Context(), CreateSandboxRequest{Snapshot: "snap-1", OnTimeout: "pause"})
	if err != nil || sb.ID != "sb9" {
		t.Fatalf("%+v %v", sb, err)
	}
}
