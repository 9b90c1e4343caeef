package agent

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/errdefs"
)

func (a *Agent) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+agentproto.PathInfo, a.handleInfo)
	mux.HandleFunc("POST "+agentproto.PathInit, a.handleInit)
	mux.HandleFunc("GET "+agentproto.PathProcesses, a.handleProcesses)
	mux.HandleFunc("POST "+agentproto.PathProcesses, a.handleStart)
	mux.HandleFunc("GET "+agentproto.PathProcess, a.handleProcess)
	mux.HandleFunc("GET "+agentproto.PathEvents, a.handleEvents)
	mux.HandleFunc("POST "+agentproto.PathStdin, a.handleStdin)
	mux.HandleFunc("POST "+agentproto.PathSignal, a.handleSignal)
	mux.HandleFunc("POST "+agentproto.PathResize, a.handleResize)
	mux.HandleFunc("GET "+agentproto.PathFiles, a.handleRead)
	mux.HandleFunc("PUT "+agentproto.PathFiles, a.handleWrite)
	mux.HandleFunc("DELETE "+agentproto.PathFiles, a.handleRemove)
	mux.HandleFunc("GET "+agentproto.PathFilesStat, a.handleStat)
	mux.HandleFunc("GET "+agentproto.PathFilesList, a.handleList)
	mux.HandleFunc("POST "+agentproto.PathFilesMkdir, a.handleMkdir)
	mux.HandleFunc("POST "+agentproto.PathFilesMove, a.handleMove)
	mux.HandleFunc("POST "+agentproto.PathFilesSymlink, a.handleSymlink)
	mux.HandleFunc("GET "+agentproto.PathFilesWatch, a.handleWatch)
	mux.HandleFunc("POST "+agentproto.PathReclaim, a.handleReclaim)
	mux.HandleFunc("POST "+agentproto.PathWarmup, a.handleWarmup)
	mux.HandleFunc("GET "+agentproto.PathStats, a.handleStats)
	mux.HandleFunc("POST "+agentproto.PathConnect, a.handleConnect)
	return mux
}

// writeError sends err as an agentproto.Error with its class's status.
func writeError(w http.ResponseWriter, err error) {
	code, status := errdefs.Classify(err)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(agentproto.Error{Code: code, Message: err.Error()})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func readJSON(r *http.Request, v any) error {
	if err := json.NewDecoder(io.LimitReader(r.Body, 16<<20)).Decode(v); err != nil {
		return errdefs.InvalidArgument("bad request body: %v", err)
	}
	return nil
}

// classOf maps an OS error to its errdefs class.
func classOf(err error) error {
	var errno unix.Errno
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return errdefs.ErrNotFound
	case errors.Is(err, fs.ErrExist), errors.Is(err, unix.ENOTEMPTY), errors.Is(err, unix.EBUSY):
		return errdefs.ErrConflict
	case errors.Is(err, fs.ErrPermission), errors.Is(err, unix.EROFS):
		return errdefs.ErrPermissionDenied
	case errors.As(err, &errno) && (errno == unix.ENOTDIR || errno == unix.EISDIR || errno == unix.EINVAL ||
		errno == unix.ENAMETOOLONG || errno == unix.ELOOP || errno == unix.EXDEV || errno == unix.ENOEXEC ||
		errno == unix.ENXIO || errno == unix.E2BIG): // ENXIO: opening a socket; E2BIG: an exec's arguments
		return errdefs.ErrInvalidArgument
	case errors.As(err, &errno) && errno == unix.ETXTBSY: // exec of a file open for writing
		return errdefs.ErrConflict
	case errors.As(err, &errno) && (errno == unix.ENOSPC || errno == unix.EDQUOT || errno == unix.EFBIG):
		return errdefs.ErrTooLarge
	case errors.As(err, &errno) && (errno == unix.EAGAIN || errno == unix.ENOMEM || errno == unix.EMFILE || errno == unix.ENFILE):
		// Out of processes, memory or files in the sandbox: the caller
		// may retry once something ended.
		return errdefs.ErrUnavailable
	}
	return errdefs.ErrInternal
}

// osError wraps an OS error into its class, keeping the (user-safe) text.
func osError(err error) error {
	if err == nil {
		return nil
	}
	for _, c := range errdefs.Classes {
		if errors.Is(err, c.Err) {
			return err // already classified
		}
	}
	return errdefs.Newf(classOf(err), "%v", err)
}

func (a *Agent) handleInfo(w http.ResponseWriter, r *http.Request) {
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	host, _ := os.Hostname()
	a.mu.Lock()
	id := a.sandboxID
	a.mu.Unlock()
	writeJSON(w, agentproto.Info{
		Version:   agentproto.Version,
		Kernel:    unix.ByteSliceToString(uts.Release[:]),
		Hostname:  host,
		PID:       os.Getpid(),
		SandboxID: id,
	})
}

func (a *Agent) handleInit(w http.ResponseWriter, r *http.Request) {
	var req agentproto.InitRequest
	if err := readJSON(r, &req); err != nil {
		writeError(w, err)
		return
	}
	a.initMu.Lock()
	defer a.initMu.Unlock()
	if req.Hostname != "" {
		if err := unix.Sethostname([]byte(req.Hostname)); err != nil {
			writeError(w, errdefs.Newf(classOf(err), "set hostname: %v", err))
			return
		}
	}
	if !req.Time.IsZero() {
		if d := time.Since(req.Time); d > time.Second || d < -time.Second {
			tv := unix.NsecToTimeval(req.Time.UnixNano())
			if err := unix.Settimeofday(&tv); err != nil {
				a.log.Warn("set time", "err", err)
			}
		}
	}
	if len(req.Seed) > 0 {
		if err := os.WriteFile("/dev/urandom", req.Seed, 0); err != nil {
			a.log.Warn("seed entropy", "err", err)
		}
	}
	if len(req.Entropy) > 0 {
		if err := reseed(req.Entropy); err != nil {
			writeError(w, errdefs.Newf(classOf(err), "%v", err))
			return
		}
	}
	if req.Egress != nil {
		if err := a.startEgress(*req.Egress); err != nil {
			writeError(w, err)
			return
		}
	}
	if dropNodePreload(req.Env, fileExists) {
		a.log.Warn("node egress preload missing; NODE_OPTIONS not set", "path", NodePreload)
	}
	a.mu.Lock()
	a.sandboxID, a.initEnv = req.SandboxID, req.Env
	a.mu.Unlock()
	if req.SandboxID != "" {
		// The identity (not a restored pool sandbox's clock and entropy).
		a.settleIdentity(req.Env, req.KeepPrestarted)
	}
	w.WriteHeader(http.StatusNoContent)
}

func (a *Agent) handleProcesses(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, a.processes())
}

func (a *Agent) handleStart(w http.ResponseWriter, r *http.Request) {
	var req agentproto.StartRequest
	if err := readJSON(r, &req); err != nil {
		writeError(w, err)
		return
	}
	follow := r.URL.Query().Get("follow") == "1"
	p, sub, err := a.start(req, follow)
	if err != nil {
		writeError(w, err)
		return
	}
	if follow {
		// Start and follow in one round trip: the pid, then the events
		// until the exit, on the same stream.
		a.writeEvents(w, r, p, sub, 1, true, p.pid)
		return
	}
	writeJSON(w, agentproto.StartResponse{PID: p.pid})
}

func (a *Agent) handleProcess(w http.ResponseWriter, r *http.Request) {
	p, err := a.process(r.PathValue("pid"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, p.snapshot())
}

// handleEvents streams a process's events as NDJSON from ?from= until the
// exit event (or, with ?follow=0, until the buffer is drained). Output is
// flushed whenever the stream catches up, so nothing waits in a buffer.
func (a *Agent) handleEvents(w http.ResponseWriter, r *http.Request) {
	p, err := a.process(r.PathValue("pid"))
	if err != nil {
		writeError(w, err)
		return
	}
	from := uint64(1)
	if s := r.URL.Query().Get("from"); s != "" {
		if from, err = strconv.ParseUint(s, 10, 64); err != nil {
			writeError(w, errdefs.InvalidArgument("bad from %q", s))
			return
		}
	}
	a.writeEvents(w, r, p, nil, from, r.URL.Query().Get("follow") != "0", 0)
}

// writeEvents streams p's events from seq from: binary frames when the
// client accepts them, NDJSON otherwise. A non-zero pid (a start with
// follow) is announced first: in a header with frames, as the first NDJSON
// line otherwise. sub, when not nil, is a subscriber already reading p
// (from is then ignored).
func (a *Agent) writeEvents(w http.ResponseWriter, r *http.Request, p *process, sub *subscriber, from uint64, follow bool, pid int) {
	if sub == nil {
		sub = p.log.subscribe(from)
	}
	defer sub.close()

	framed := strings.Contains(r.Header.Get("Accept"), agentproto.EventFramesType)
	if framed {
		w.Header().Set("Content-Type", agentproto.EventFramesType)
		if pid != 0 {
			w.Header().Set(agentproto.HeaderPID, strconv.Itoa(pid))
		}
	} else {
		w.Header().Set("Content-Type", "application/x-ndjson")
	}
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	defer abortOnDone(r, rc)()
	enc := json.NewEncoder(w)
	if pid != 0 && !framed {
		if err := enc.Encode(agentproto.StartResponse{PID: pid}); err != nil {
			return
		}
	}
	encode := func(ev *agentproto.Event) error { return enc.Encode(ev) }
	if framed {
		// The response writer buffers (4 KiB); frames go straight to it,
		// and each batch ends with one flush.
		encode = func(ev *agentproto.Event) error { return agentproto.WriteEventFrame(w, ev) }
	}
	var buf []agentproto.Event
	for {
		batch, last, err := sub.next(r.Context(), follow, buf)
		if err != nil {
			return
		}
		for i := range batch {
			if err := encode(&batch[i]); err != nil {
				return
			}
		}
		clear(batch) // drop Data references before waiting
		buf = batch[:0]
		if last {
			// No flush: the server writes what is buffered together with
			// the end of the response, one write instead of two.
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
	}
}

// abortOnDone makes writes fail once the client went away. A yamux close
// is only a half-close: without this a handler blocked writing into a
// stream its reader abandoned would wait for a window update forever.
func abortOnDone(r *http.Request, rc *http.ResponseController) (stop func() bool) {
	return context.AfterFunc(r.Context(), func() { _ = rc.SetWriteDeadline(time.Unix(1, 0)) })
}

func (a *Agent) handleStdin(w http.ResponseWriter, r *http.Request) {
	p, err := a.process(r.PathValue("pid"))
	if err != nil {
		writeError(w, err)
		return
	}
	if err := p.writeStdin(r.Context(), r.Body, r.URL.Query().Get("eof") == "1"); err != nil {
		writeError(w, osError(err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (a *Agent) handleSignal(w http.ResponseWriter, r *http.Request) {
	p, err := a.process(r.PathValue("pid"))
	if err != nil {
		writeError(w, err)
		return
	}
	var req agentproto.SignalRequest
	if err := readJSON(r, &req); err != nil {
		writeError(w, err)
		return
	}
	if err := p.signal(req.Signal); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (a *Agent) handleResize(w http.ResponseWriter, r *http.Request) {
	p, err := a.process(r.PathValue("pid"))
	if err != nil {
		writeError(w, err)
		return
	}
	var req agentproto.ResizeRequest
	if err := readJSON(r, &req); err != nil {
		writeError(w, err)
		return
	}
	if err := p.resize(req); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
