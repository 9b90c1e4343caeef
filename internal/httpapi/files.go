package httpapi

import (
	"errors"
	"io"
	"net/http"
	"strconv"

	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandbox"
)

func pathParam(r *http.Request) string { return r.URL.Query().Get("path") }

// writtenFile is the answer to an upload: the file, and the SHA-256 of
// the bytes written (what the caller can compare with its own).
type writtenFile struct {
	agentproto.FileInfo
	SHA256 string `json:"sha256"`
}

func (a *API) writeFile(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	q := r.URL.Query()
	fi, sum, err := a.svc.WriteFileChecked(r.Context(), c, r.PathValue("id"), pathParam(r), q.Get("user"), r.Body, q.Get("sha256"))
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, writtenFile{FileInfo: fi, SHA256: sum})
}

func (a *API) readFile(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	rc, size, err := a.svc.ReadFile(r.Context(), c, r.PathValue("id"), pathParam(r))
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	if size >= 0 {
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	}
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, rc); err != nil && !errors.Is(err, r.Context().Err()) {
		a.log.Warn("file download interrupted", "sandbox", r.PathValue("id"), "err", err)
		panic(http.ErrAbortHandler) // make the truncation visible to the client
	}
}

func (a *API) removeFile(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	recursive := r.URL.Query().Get("recursive") == "true"
	if err := a.svc.Remove(r.Context(), c, r.PathValue("id"), pathParam(r), recursive); err != nil {
		a.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (a *API) statFile(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	fi, err := a.svc.Stat(r.Context(), c, r.PathValue("id"), pathParam(r))
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, fi)
}

func (a *API) listFiles(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	depth := 1
	if s := r.URL.Query().Get("depth"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			a.writeError(w, r, errdefs.InvalidArgument("depth: must be an integer"))
			return
		}
		depth = n
	}
	entries, err := a.svc.ListFiles(r.Context(), c, r.PathValue("id"), pathParam(r), depth)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	if entries == nil {
		entries = []agentproto.FileInfo{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"entries": entries})
}

func (a *API) mkdir(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	var req struct {
		Path string `json:"path"`
		User string `json:"user"`
	}
	if err := decode(r, &req); err != nil {
		a.writeError(w, r, err)
		return
	}
	fi, err := a.svc.Mkdir(r.Context(), c, r.PathValue("id"), req.Path, req.User)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, fi)
}

func (a *API) move(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	var req struct {
		From string `json:"from"`
		To   string `json:"to"`
	}
	if err := decode(r, &req); err != nil {
		a.writeError(w, r, err)
		return
	}
	fi, err := a.svc.Move(r.Context(), c, r.PathValue("id"), req.From, req.To)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, fi)
}

// watch streams filesystem changes under a directory as SSE `change` events.
func (a *API) watch(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	recursive := r.URL.Query().Get("recursive") == "true"
	ws, err := a.svc.Watch(r.Context(), c, r.PathValue("id"), pathParam(r), recursive)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	defer ws.Close()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	go func() {
		<-r.Context().Done()
		ws.Close()
	}()
	var buf bytesBuffer
	for {
		ev, err := ws.Next()
		if err != nil {
			return
		}
		buf.Reset()
		writeSSE(&buf.Buffer, "", "change", ev)
		if _, err := w.Write(buf.Bytes()); err != nil {
			return
		}
		_ = rc.Flush()
	}
}
