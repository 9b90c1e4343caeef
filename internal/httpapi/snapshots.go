package httpapi

import (
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/snapshot"
	"github.com/spacesandbox/space/internal/store"
)

// Snapshot is the API view of a snapshot.
type Snapshot struct {
	ID         string    `json:"id"`
	SandboxID  string    `json:"sandbox_id"`
	Kind       string    `json:"kind"`
	Name       string    `json:"name,omitempty"`
	Automatic  bool      `json:"automatic"`
	Status     string    `json:"status"`
	Error      string    `json:"error,omitempty"`
	Parent     string    `json:"parent,omitempty"`
	Template   string    `json:"template"`
	CreatedAt  time.Time `json:"created_at"`
	BytesNew   int64     `json:"bytes_new"`
	BytesTotal int64     `json:"bytes_total"`
	Verified   bool      `json:"verified,omitempty"`
	// CommandID and Cause: the command it was taken after
	// (snapshot_on_exec).
	CommandID int64  `json:"command_id,omitempty"`
	Cause     string `json:"cause,omitempty"`
}

func viewSnapshot(sn store.Snapshot) Snapshot {
	return Snapshot{ID: sn.ID, SandboxID: sn.SandboxID, Kind: sn.Kind, Name: sn.Name, Automatic: sn.Automatic,
		Status: sn.Status, Error: sn.Error, Parent: sn.Parent, Template: sn.Template, CreatedAt: sn.CreatedAt,
		BytesNew: sn.BytesNew, BytesTotal: sn.BytesTotal, CommandID: sn.CommandSeq, Cause: sn.Cause}
}

func (a *API) createSnapshot(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	var req sandbox.SnapshotRequest
	if err := decode(r, &req); err != nil {
		a.writeError(w, r, err)
		return
	}
	sn, err := a.svc.Snapshot(r.Context(), c, r.PathValue("id"), req)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, viewSnapshot(sn))
}

func (a *API) listSnapshots(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	snaps, err := a.svc.Snapshots(r.Context(), c, r.PathValue("id"))
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	out := []Snapshot{}
	for _, sn := range snaps {
		out = append(out, viewSnapshot(sn))
	}
	writeJSON(w, http.StatusOK, map[string]any{"snapshots": out})
}

// getSnapshot answers one snapshot; ?verify=true first re-hashes every
// chunk it references (an error if any is missing or corrupt).
func (a *API) getSnapshot(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	sn, err := a.svc.GetSnapshot(r.Context(), c, r.PathValue("sid"))
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	v := viewSnapshot(sn)
	if r.URL.Query().Get("verify") == "true" {
		if err := a.svc.VerifySnapshot(r.Context(), c, sn.ID); err != nil {
			a.writeError(w, r, err)
			return
		}
		v.Verified = true
	}
	writeJSON(w, http.StatusOK, v)
}

func (a *API) deleteSnapshot(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	if err := a.svc.DeleteSnapshot(r.Context(), c, r.PathValue("sid")); err != nil {
		a.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

type snapshotEntry struct {
	Path    string    `json:"path"`
	Name    string    `json:"name"`
	Type    string    `json:"type"`
	Size    int64     `json:"size"`
	Mode    uint32    `json:"mode"`
	ModTime time.Time `json:"mtime"`
	Link    string    `json:"target,omitempty"`
}

func viewEntry(e snapshot.FileEntry) snapshotEntry {
	name := e.Path
	for i := len(name) - 1; i >= 0; i-- {
		if name[i] == '/' {
			name = name[i+1:]
			break
		}
	}
	return snapshotEntry{Path: "/" + e.Path, Name: name, Type: string(e.Type), Size: e.Size, Mode: e.Mode, ModTime: e.ModTime, Link: e.Link}
}

// snapshotFiles answers with a file's bytes, or a directory's listing.
func (a *API) snapshotFiles(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	p := pathParam(r)
	if p == "" {
		p = "/"
	}
	f, err := a.svc.ReadSnapshotPath(r.Context(), c, r.PathValue("sid"), p)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	if f.Content == nil {
		out := []snapshotEntry{}
		for _, e := range f.List {
			out = append(out, viewEntry(e))
		}
		writeJSON(w, http.StatusOK, map[string]any{"entries": out})
		return
	}
	defer f.Content.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(f.Entry.Size, 10))
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, f.Content); err != nil {
		panic(http.ErrAbortHandler)
	}
}

func (a *API) diffSnapshots(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	q := r.URL.Query()
	from, to := q.Get("from"), q.Get("to")
	if from == "" || to == "" {
		a.writeError(w, r, errdefs.InvalidArgument("from and to: two snapshot ids are required"))
		return
	}
	if q.Has("path") {
		d, err := a.svc.DiffFile(r.Context(), c, from, to, q.Get("path"))
		if err != nil {
			a.writeError(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, d)
		return
	}
	changes, err := a.svc.DiffSnapshots(r.Context(), c, from, to)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	type change struct {
		Path    string `json:"path"`
		Kind    string `json:"kind"`
		Type    string `json:"type"`
		OldSize int64  `json:"old_size"`
		NewSize int64  `json:"new_size"`
	}
	out := []change{}
	for _, ch := range changes {
		out = append(out, change{Path: "/" + ch.Path, Kind: string(ch.Kind), Type: string(ch.Type), OldSize: ch.OldSize, NewSize: ch.NewSize})
	}
	writeJSON(w, http.StatusOK, map[string]any{"from": from, "to": to, "changes": out})
}

func (a *API) restore(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	var req struct {
		Snapshot string   `json:"snapshot"`
		Paths    []string `json:"paths"`
		// BeforeCommand restores as the files were before that command
		// (a command id) started, instead of from a named snapshot.
		BeforeCommand int64 `json:"before_command"`
	}
	if err := decode(r, &req); err != nil {
		a.writeError(w, r, err)
		return
	}
	if (req.Snapshot == "") == (req.BeforeCommand == 0) {
		a.writeError(w, r, errdefs.InvalidArgument("snapshot or before_command: give exactly one"))
		return
	}
	var res sandbox.RestoreResult
	var err error
	if req.BeforeCommand != 0 {
		res, err = a.svc.RestoreBefore(r.Context(), c, r.PathValue("id"), req.BeforeCommand, req.Paths)
	} else {
		res, err = a.svc.RestoreFiles(r.Context(), c, r.PathValue("id"), req.Snapshot, req.Paths)
	}
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	if res.Written == nil {
		res.Written = []string{}
	}
	if res.Removed == nil {
		res.Removed = []string{}
	}
	writeJSON(w, http.StatusOK, res)
}

func (a *API) fork(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	var req struct {
		Count    int    `json:"count"`
		Snapshot string `json:"snapshot"`
	}
	if err := decode(r, &req); err != nil {
		a.writeError(w, r, err)
		return
	}
	kids, err := a.svc.Fork(r.Context(), c, r.PathValue("id"), req.Count, req.Snapshot)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	out := []Sandbox{}
	for _, k := range kids {
		out = append(out, viewSandbox(k))
	}
	writeJSON(w, http.StatusCreated, map[string]any{"sandboxes": out})
}

// fileHistory answers the versions of one path across a sandbox's
// timeline.
func (a *API) fileHistory(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	p := pathParam(r)
	vs, err := a.svc.FileHistory(r.Context(), c, r.PathValue("id"), p)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"path": p, "versions": vs})
}
