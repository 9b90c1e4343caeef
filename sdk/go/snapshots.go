package space

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"time"
)

// Snapshot kinds, for SnapshotRequest.Kind and Snapshot.Kind.
const (
	// SnapshotCheckpoint holds memory, processes and the writable
	// filesystem layer: the sandbox can be resumed or forked from it.
	SnapshotCheckpoint = "checkpoint"
	// SnapshotFiles holds the writable filesystem layer only, taken without
	// stopping the sandbox.
	SnapshotFiles = "files"
)

// Snapshot statuses, in Snapshot.Status.
const (
	SnapshotCreating = "creating"
	SnapshotReady    = "ready"
	SnapshotFailed   = "failed" // Snapshot.Error says why
)

// Change kinds, in Change.Kind.
const (
	ChangeAdded    = "added"
	ChangeRemoved  = "removed"
	ChangeModified = "modified"
)

// Errors of ReadSnapshotFile and ListSnapshotDir when the path is not of the
// kind asked for. They are local, not *APIError values.
var (
	ErrIsDir  = errors.New("is a directory")
	ErrNotDir = errors.New("not a directory")
)

// Snapshot is one point in a sandbox's timeline.
type Snapshot struct {
	ID         string    `json:"id"`
	SandboxID  string    `json:"sandbox_id"`
	Kind       string    `json:"kind"` // SnapshotCheckpoint or SnapshotFiles
	Name       string    `json:"name,omitempty"`
	Automatic  bool      `json:"automatic"` // taken by the server (interval, pause), not asked for
	Status     string    `json:"status"`    // SnapshotCreating, SnapshotReady or SnapshotFailed
	Error      string    `json:"error,omitempty"`
	Parent     string    `json:"parent,omitempty"` // the previous ready snapshot of the sandbox
	Template   string    `json:"template"`
	CreatedAt  time.Time `json:"created_at"`
	BytesNew   int64     `json:"bytes_new"`          // bytes stored that no earlier snapshot had
	BytesTotal int64     `json:"bytes_total"`        // bytes the snapshot references in all
	Verified   bool      `json:"verified,omitempty"` // set by GetSnapshot(…, verify=true)
	// CommandID and Cause name the command it was taken after (a sandbox
	// created with SnapshotOnExec); Cause is that command's line.
	CommandID int64  `json:"command_id,omitempty"`
	Cause     string `json:"cause,omitempty"`
}

// SnapshotRequest is the body of POST /v1/sandboxes/{id}/snapshots. A zero
// Kind means SnapshotCheckpoint.
type SnapshotRequest struct {
	Kind string `json:"kind,omitempty"`
	Name string `json:"name,omitempty"` // lowercase letters, digits, '.', '_', '-'; at most 64
}

// SnapshotEntry is one entry of a directory in a snapshot.
type SnapshotEntry struct {
	Path   string    `json:"path"` // absolute
	Name   string    `json:"name"`
	Type   string    `json:"type"` // "file", "dir", "symlink", "hardlink", …
	Size   int64     `json:"size"`
	Mode   uint32    `json:"mode"`
	MTime  time.Time `json:"mtime"`
	Target string    `json:"target,omitempty"` // a link's target
}

// IsDir reports whether the entry is a directory.
func (e SnapshotEntry) IsDir() bool { return e.Type == FileTypeDir }

// Change is how one path differs between two snapshots.
type Change struct {
	Path    string `json:"path"` // absolute
	Kind    string `json:"kind"` // ChangeAdded, ChangeRemoved or ChangeModified
	Type    string `json:"type"` // the entry's type in the newer snapshot (the older, when removed)
	OldSize int64  `json:"old_size"`
	NewSize int64  `json:"new_size"`
}

// RestoreResult says what RestoreFiles changed in the sandbox.
type RestoreResult struct {
	Snapshot string   `json:"snapshot"` // the snapshot the files came from
	Written  []string `json:"written"`
	Removed  []string `json:"removed"`
}

// ForkRequest is the body of POST /v1/sandboxes/{id}/fork.
type ForkRequest struct {
	Count    int    `json:"count,omitempty"`    // children to start; 0 means 1
	Snapshot string `json:"snapshot,omitempty"` // fork from this checkpoint instead of the running state
}

func sandboxPath(id, op string) string { return "/v1/sandboxes/" + seg(id) + "/" + op }

func snapshotPath(sid string) string { return "/v1/snapshots/" + seg(sid) }

// PauseSandbox pauses a running sandbox; its processes stop until
// ResumeSandbox. IsConflict(err) when the sandbox is not running; the
// *APIError's State says what it is.
func (c *Client) PauseSandbox(ctx context.Context, id string) (*Sandbox, error) {
	var sb Sandbox
	if err := c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, "pause")}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// ResumeSandbox resumes a paused sandbox. IsConflict(err) when it is not
// paused.
func (c *Client) ResumeSandbox(ctx context.Context, id string) (*Sandbox, error) {
	var sb Sandbox
	if err := c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, "resume")}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// CreateSnapshot snapshots a running sandbox and returns the snapshot once
// it is stored. IsNotSupported(err) when the server or driver cannot.
func (c *Client) CreateSnapshot(ctx context.Context, id string, req SnapshotRequest) (*Snapshot, error) {
	var sn Snapshot
	if err := c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, "snapshots"), json: req}, &sn); err != nil {
		return nil, err
	}
	return &sn, nil
}

// ListSnapshots returns a sandbox's timeline, oldest first. It still answers
// after the sandbox is gone, while its snapshots are kept.
func (c *Client) ListSnapshots(ctx context.Context, id string) ([]Snapshot, error) {
	var out struct {
		Snapshots []Snapshot `json:"snapshots"`
	}
	if err := c.do(ctx, request{method: http.MethodGet, path: sandboxPath(id, "snapshots")}, &out); err != nil {
		return nil, err
	}
	return out.Snapshots, nil
}

// GetSnapshot returns one snapshot. With verify the server first re-hashes
// every chunk the snapshot references, fails if any is missing or corrupt,
// and sets Verified.
func (c *Client) GetSnapshot(ctx context.Context, sid string, verify bool) (*Snapshot, error) {
	var q url.Values
	if verify {
		q = url.Values{"verify": {"true"}}
	}
	var sn Snapshot
	if err := c.do(ctx, request{method: http.MethodGet, path: snapshotPath(sid), query: q}, &sn); err != nil {
		return nil, err
	}
	return &sn, nil
}

// DeleteSnapshot deletes a snapshot; chunks no other snapshot uses are
// reclaimed.
func (c *Client) DeleteSnapshot(ctx context.Context, sid string) error {
	return c.do(ctx, request{method: http.MethodDelete, path: snapshotPath(sid)}, nil)
}

// snapshotFiles fetches GET /v1/snapshots/{sid}/files?path= and reports
// whether the answer is a directory listing (JSON) rather than file bytes.
func (c *Client) snapshotFiles(ctx context.Context, sid, path, accept string) (*http.Response, bool, error) {
	resp, err := c.send(ctx, request{
		method: http.MethodGet,
		path:   snapshotPath(sid) + "/files",
		query:  url.Values{"path": {path}},
		header: http.Header{"Accept": {accept}},
	})
	if err != nil {
		return nil, false, err
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	return resp, mt == "application/json", nil
}

// ReadSnapshotFile opens the file at path (absolute) as it was in snapshot
// sid. The caller must close it. A directory yields an error wrapping
// ErrIsDir; use ListSnapshotDir for those.
func (c *Client) ReadSnapshotFile(ctx context.Context, sid, path string) (io.ReadCloser, error) {
	resp, isDir, err := c.snapshotFiles(ctx, sid, path, "application/octet-stream")
	if err != nil {
		return nil, err
	}
	if isDir {
		resp.Body.Close()
		return nil, fmt.Errorf("space: %s in snapshot %s: %w", path, sid, ErrIsDir)
	}
	return resp.Body, nil
}

// ListSnapshotDir lists the directory at path (absolute; "" means "/") as
// it was in snapshot sid. A file yields an error wrapping ErrNotDir.
func (c *Client) ListSnapshotDir(ctx context.Context, sid, path string) ([]SnapshotEntry, error) {
	if path == "" {
		path = "/"
	}
	resp, isDir, err := c.snapshotFiles(ctx, sid, path, "application/json")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if !isDir {
		return nil, fmt.Errorf("space: %s in snapshot %s: %w", path, sid, ErrNotDir)
	}
	var out struct {
		Entries []SnapshotEntry `json:"entries"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("space: decode snapshot listing: %w", err)
	}
	return out.Entries, nil
}

// DiffSnapshots lists how the filesystem differs from snapshot from to
// snapshot to, sorted by path.
func (c *Client) DiffSnapshots(ctx context.Context, from, to string) ([]Change, error) {
	var out struct {
		Changes []Change `json:"changes"`
	}
	q := url.Values{"from": {from}, "to": {to}}
	if err := c.do(ctx, request{method: http.MethodGet, path: "/v1/snapshots/diff", query: q}, &out); err != nil {
		return nil, err
	}
	return out.Changes, nil
}

// RestoreFiles brings paths (every path when paths is empty) of running
// sandbox id back to how they were in snapshot sid: files are rewritten,
// and files added since are removed.
func (c *Client) RestoreFiles(ctx context.Context, id, sid string, paths []string) (*RestoreResult, error) {
	body := struct {
		Snapshot string   `json:"snapshot"`
		Paths    []string `json:"paths,omitempty"`
	}{sid, paths}
	var res RestoreResult
	if err := c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, "restore"), json: body}, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// Fork starts req.Count copies (default 1) of sandbox id, from its running
// state or, with req.Snapshot, from that checkpoint, and returns them.
func (c *Client) Fork(ctx context.Context, id string, req ForkRequest) ([]Sandbox, error) {
	var out struct {
		Sandboxes []Sandbox `json:"sandboxes"`
	}
	if err := c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, "fork"), json: req}, &out); err != nil {
		return nil, err
	}
	return out.Sandboxes, nil
}

// FileVersion is one version of a path in a sandbox's timeline (see
// FileHistory).
type FileVersion struct {
	Snapshot  string    `json:"snapshot"`           // the first snapshot holding this version ("" with Template)
	Template  bool      `json:"template,omitempty"` // the template's version, before any snapshot
	CreatedAt time.Time `json:"created_at"`
	CommandID int64     `json:"command_id,omitempty"` // the command that made it (SnapshotOnExec)
	Command   string    `json:"command,omitempty"`
	Deleted   bool      `json:"deleted,omitempty"` // the path is gone in this snapshot
	Type      string    `json:"type,omitempty"`
	Size      int64     `json:"size"`
	Mode      uint32    `json:"mode,omitempty"`
	SHA256    string    `json:"sha256,omitempty"` // of a regular file's content (up to 256 MiB)
	Target    string    `json:"target,omitempty"` // a symlink's target
}

// FileHistory lists the versions of path across sandbox id's timeline,
// oldest first: one entry per snapshot where its content changed.
func (c *Client) FileHistory(ctx context.Context, id, path string) ([]FileVersion, error) {
	var out struct {
		Versions []FileVersion `json:"versions"`
	}
	q := url.Values{"path": {path}}
	if err := c.do(ctx, request{method: http.MethodGet, path: sandboxPath(id, "files/history"), query: q}, &out); err != nil {
		return nil, err
	}
	return out.Versions, nil
}

// FileDiff is a unified diff of one file between two snapshots.
type FileDiff struct {
	From       string `json:"from"`
	To         string `json:"to"`
	Path       string `json:"path"`
	FromExists bool   `json:"from_exists"`
	ToExists   bool   `json:"to_exists"`
	FromSize   int64  `json:"from_size"`
	ToSize     int64  `json:"to_size"`
	Binary     bool   `json:"binary,omitempty"`    // not text: no Diff
	TooLarge   bool   `json:"too_large,omitempty"` // a side over 1 MiB: no Diff
	Same       bool   `json:"same"`
	Diff       string `json:"diff"`
}

// DiffFile diffs path between snapshots from and to.
func (c *Client) DiffFile(ctx context.Context, from, to, path string) (*FileDiff, error) {
	var out FileDiff
	q := url.Values{"from": {from}, "to": {to}, "path": {path}}
	if err := c.do(ctx, request{method: http.MethodGet, path: "/v1/snapshots/diff", query: q}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// RestoreBefore brings paths (every path when empty) of running sandbox id
// back to how they were before command cmdID (Command.ID) started; a path
// that did not exist then is removed.
func (c *Client) RestoreBefore(ctx context.Context, id string, cmdID int64, paths []string) (*RestoreResult, error) {
	body := struct {
		BeforeCommand int64    `json:"before_command"`
		Paths         []string `json:"paths,omitempty"`
	}{cmdID, paths}
	var res RestoreResult
	if err := c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, "restore"), json: body}, &res); err != nil {
		return nil, err
	}
	return &res, nil
}
