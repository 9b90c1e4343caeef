package e2b

import (
	"compress/gzip"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/spacesandbox/space/internal/e2b/gen/filesystem"
	"github.com/spacesandbox/space/internal/e2b/gen/filesystem/filesystemconnect"
	"github.com/spacesandbox/space/internal/e2b/gen/process"
	"github.com/spacesandbox/space/internal/e2b/gen/process/processconnect"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandbox"
)

// envdTarget is the sandbox an envd request is for, with the caller its
// access token stands for (the sandbox's team).
type envdTarget struct {
	id     string
	caller sandbox.Caller
	signed bool // authorized by a URL signature (for its path only), not the access token
}

type targetKey struct{}

func targetOf(ctx context.Context) envdTarget {
	t, _ := ctx.Value(targetKey{}).(envdTarget)
	return t
}

func (h *Handler) envdMux() http.Handler {
	m := http.NewServeMux()
	h.procs = &processServer{h: h}
	_, ph := processconnect.NewProcessHandler(h.procs)
	_, fh := filesystemconnect.NewFilesystemHandler(&filesystemServer{h: h})
	// Each procedure on its own path (not the services' prefixes), so an
	// unknown one reaches the JSON fallback below, not connect's text 404.
	for _, svc := range []struct {
		fd      protoreflect.FileDescriptor
		handler http.Handler
	}{{process.File_process_proto, ph}, {filesystem.File_filesystem_proto, fh}} {
		for i := range svc.fd.Services().Len() {
			sd := svc.fd.Services().Get(i)
			for j := range sd.Methods().Len() {
				m.Handle("/"+string(sd.FullName())+"/"+string(sd.Methods().Get(j).Name()), svc.handler)
			}
		}
	}
	m.HandleFunc("GET /files", h.getFile)
	m.HandleFunc("POST /files", h.postFile)
	m.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.Count(r.URL.Path, "/") == 2 && strings.Contains(r.URL.Path, ".") {
			// An RPC space does not serve: a Connect error, not a bare 404.
			writeJSON(w, http.StatusNotImplemented, map[string]string{"code": "unimplemented", "message": r.URL.Path + " is not implemented"})
			return
		}
		writeJSONError(w, http.StatusNotFound, "no route for "+r.Method+" "+r.URL.Path)
	})
	return m
}

// serveEnvd authenticates an envd request and hands it to the envd mux.
// /files takes the access token or a URL signature; everything else,
// /health included, needs X-Access-Token (the SDK sends it on every envd
// call). The token is checked before the sandbox is looked up: a token is
// an HMAC of the id, so this needs no lookup, and a caller without one
// gets the same 401 whether the id exists or not (an unauthenticated
// /health told anyone which sandbox ids exist).
func (h *Handler) serveEnvd(w http.ResponseWriter, r *http.Request, id string) {
	ctx := r.Context()
	token := h.accessToken(id)
	ok := subtle.ConstantTimeCompare([]byte(r.Header.Get("X-Access-Token")), []byte(token)) == 1
	signed := false
	if !ok && r.URL.Path == "/files" {
		ok = h.validSignature(r, token)
		signed = ok
	}
	if !ok {
		if r.URL.Path == "/files" {
			writeJSONError(w, http.StatusUnauthorized, "unauthorized access, please provide a valid access token or signature")
		} else {
			writeJSON(w, http.StatusUnauthorized, map[string]string{"code": "unauthenticated", "message": "unauthorized access, please provide a valid X-Access-Token"})
		}
		return
	}
	sb, err := h.svc.Get(ctx, sandbox.Caller{Admin: true}, id)
	if err != nil || sb.State == sandbox.StateStopped || sb.State == sandbox.StateStopping {
		// What E2B's proxy says for a sandbox that is gone.
		writeJSONError(w, http.StatusBadGateway, fmt.Sprintf("sandbox %s not found", e2bID(id)))
		return
	}
	if r.URL.Path == "/health" {
		if sb.State != sandbox.StateRunning {
			writeJSONError(w, http.StatusBadGateway, "sandbox "+e2bID(id)+" is "+sb.State)
			return
		}
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if err := h.svc.AllowRequest(ctx, sandbox.Caller{Team: sb.Team}); err != nil {
		h.writeError(w, r, err)
		return
	}
	ctx = context.WithValue(ctx, targetKey{}, envdTarget{id: id, caller: sandbox.Caller{Team: sb.Team}, signed: signed})
	h.envd.ServeHTTP(w, r.WithContext(ctx))
}

// validSignature checks a signed /files URL (uploadUrl/downloadUrl):
// "v1_" + base64(sha256("<path>:<read|write>:<user>:<token>[:<exp>]")).
func (h *Handler) validSignature(r *http.Request, token string) bool {
	q := r.URL.Query()
	sig := q.Get("signature")
	if sig == "" {
		return false
	}
	op := "read"
	if r.Method == http.MethodPost {
		op = "write"
	}
	raw := q.Get("path") + ":" + op + ":" + q.Get("username") + ":" + token
	if exp := q.Get("signature_expiration"); exp != "" {
		n, err := strconv.ParseInt(exp, 10, 64)
		if err != nil || time.Now().Unix() > n {
			return false
		}
		raw += ":" + exp
	}
	sum := sha256.Sum256([]byte(raw))
	want := "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
	return subtle.ConstantTimeCompare([]byte(sig), []byte(want)) == 1
}

// connectError maps an error class onto a Connect code.
func connectError(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	code := connect.CodeInternal
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		code = connect.CodeNotFound
	case errors.Is(err, errdefs.ErrInvalidArgument):
		code = connect.CodeInvalidArgument
	case errors.Is(err, errdefs.ErrUnauthenticated):
		code = connect.CodeUnauthenticated
	case errors.Is(err, errdefs.ErrPermissionDenied):
		code = connect.CodePermissionDenied
	case errors.Is(err, errdefs.ErrConflict):
		code = connect.CodeFailedPrecondition
	case errors.Is(err, errdefs.ErrTooLarge), errors.Is(err, errdefs.ErrNoStorage):
		code = connect.CodeResourceExhausted
	case errors.Is(err, errdefs.ErrNotSupported):
		code = connect.CodeUnimplemented
	case errors.Is(err, errdefs.ErrUnavailable):
		code = connect.CodeUnavailable
	case errors.Is(err, errdefs.ErrDeadline):
		code = connect.CodeDeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = connect.CodeCanceled
	}
	msg := err.Error()
	if code == connect.CodeInternal {
		msg = "internal error"
	}
	return connect.NewError(code, errors.New(msg))
}

// fileError writes envd's JSON error for /files.
func (h *Handler) fileError(w http.ResponseWriter, r *http.Request, p string, err error) {
	_, status := errdefs.Classify(err)
	msg := err.Error()
	switch {
	case status == http.StatusNotFound:
		msg = fmt.Sprintf("path '%s' does not exist", p)
	case status == http.StatusInternalServerError:
		h.log.Error("envd files", "path", p, "err", err)
		msg = "internal error"
	case status == http.StatusConflict:
		status = http.StatusBadRequest
	}
	writeJSONError(w, status, msg)
}

// getFile serves GET /files?path=: the raw bytes.
func (h *Handler) getFile(w http.ResponseWriter, r *http.Request) {
	t := targetOf(r.Context())
	p := r.URL.Query().Get("path")
	if p == "" {
		writeJSONError(w, http.StatusBadRequest, "path is required")
		return
	}
	st, err := h.svc.Stat(r.Context(), t.caller, t.id, p)
	if err == nil && st.Type == "dir" {
		err = errdefs.InvalidArgument("path '%s' is a directory", p)
	}
	if err != nil {
		h.fileError(w, r, p, err)
		return
	}
	rc, size, err := h.svc.ReadFile(r.Context(), t.caller, t.id, p)
	if err != nil {
		h.fileError(w, r, p, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": path.Base(st.Path)}))
	if size >= 0 {
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	}
	w.WriteHeader(http.StatusOK)
	_, _ = io.Copy(w, rc)
}

type writtenJSON struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

// fileUser is the user a /files request writes as: ?username= (the SDK
// sends it, and a signed URL is signed with it), else the Basic-auth user.
func fileUser(r *http.Request) string {
	if u := r.URL.Query().Get("username"); u != "" {
		return u
	}
	return userOf(r.Header)
}

// postFile serves POST /files: multipart parts named "file" whose filename
// is the full target path (the ?path= query wins for a single file), or a
// raw octet-stream body (optionally gzip) written to ?path=.
func (h *Handler) postFile(w http.ResponseWriter, r *http.Request) {
	t := targetOf(r.Context())
	qpath := r.URL.Query().Get("path")
	if t.signed && qpath == "" {
		writeJSONError(w, http.StatusBadRequest, "a signed upload URL must name its path")
		return
	}
	ct, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var out []writtenJSON
	write := func(p string, body io.Reader) bool {
		if p == "" {
			writeJSONError(w, http.StatusBadRequest, "path is required (query or part filename)")
			return false
		}
		fi, err := h.svc.WriteFileAs(r.Context(), t.caller, t.id, p, fileUser(r), body)
		if err != nil {
			h.fileError(w, r, p, err)
			return false
		}
		out = append(out, writtenJSON{Name: path.Base(fi.Path), Type: "file", Path: fi.Path})
		return true
	}
	body := io.Reader(r.Body)
	if strings.EqualFold(r.Header.Get("Content-Encoding"), "gzip") {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			writeJSONError(w, http.StatusBadRequest, "bad gzip body: "+err.Error())
			return
		}
		defer zr.Close()
		body = zr
	}
	if ct == "multipart/form-data" {
		mr := multipart.NewReader(body, params["boundary"])
		n := 0
		for {
			part, err := mr.NextPart()
			if err == io.EOF {
				break
			}
			if err != nil {
				writeJSONError(w, http.StatusBadRequest, "bad multipart body: "+err.Error())
				return
			}
			if part.FormName() != "file" {
				part.Close()
				continue
			}
			// part.FileName() strips directories; the SDK puts the
			// full target path there.
			_, dp, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
			p := dp["filename"]
			if qpath != "" && n == 0 {
				p = qpath
			}
			if t.signed && n > 0 {
				// A signed URL grants its one path: a second part would
				// write wherever its filename says.
				part.Close()
				writeJSONError(w, http.StatusBadRequest, "a signed upload URL writes one file (its path); send one file part")
				return
			}
			n++
			ok := write(p, part)
			part.Close()
			if !ok {
				return
			}
		}
		if len(out) == 0 {
			writeJSONError(w, http.StatusBadRequest, "no file part in the body")
			return
		}
	} else if !write(qpath, body) {
		return
	}
	writeJSON(w, http.StatusOK, out)
}
