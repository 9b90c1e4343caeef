package e2b

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/e2b/gen/filesystem"
	"github.com/spacesandbox/space/internal/e2b/gen/filesystem/filesystemconnect"
	"github.com/spacesandbox/space/internal/errdefs"
)

// filesystemServer is envd's filesystem.Filesystem over the sandbox
// service.
type filesystemServer struct {
	h *Handler
}

var _ filesystemconnect.FilesystemHandler = (*filesystemServer)(nil)

func entryInfo(fi agentproto.FileInfo) *filesystem.EntryInfo {
	e := &filesystem.EntryInfo{
		Name: fi.Name, Path: fi.Path, Size: fi.Size, Mode: fi.Mode,
		Owner: fi.Owner, Group: fi.Owner, ModifiedTime: timestamppb.New(fi.ModTime),
	}
	if e.Name == "" {
		e.Name = path.Base(fi.Path)
	}
	mode := os.FileMode(fi.Mode & 0o7777)
	switch fi.Type {
	case "file":
		e.Type = filesystem.FileType_FILE_TYPE_FILE
	case "dir":
		e.Type = filesystem.FileType_FILE_TYPE_DIRECTORY
		mode |= os.ModeDir
	case "symlink":
		e.Type = filesystem.FileType_FILE_TYPE_SYMLINK
		mode |= os.ModeSymlink
		if fi.Target != "" {
			// envd reports the target as an absolute path (it resolves
			// the link); the agent gives what the link holds, which may
			// be relative to the link's directory.
			target := fi.Target
			if !path.IsAbs(target) {
				target = path.Join(path.Dir(fi.Path), target)
			}
			e.SymlinkTarget = &target
		}
	}
	e.Permissions = mode.String()
	return e
}

func (f *filesystemServer) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	t := targetOf(ctx)
	fi, err := f.h.svc.Stat(ctx, t.caller, t.id, req.Msg.GetPath())
	if err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: entryInfo(fi)}), nil
}

// MakeDir creates a directory and its parents; an existing one is
// already_exists (the SDK's makeDir answers false).
func (f *filesystemServer) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	t := targetOf(ctx)
	if _, err := f.h.svc.Stat(ctx, t.caller, t.id, req.Msg.GetPath()); err == nil {
		return nil, connect.NewError(connect.CodeAlreadyExists, errors.New("path already exists: "+req.Msg.GetPath()))
	}
	fi, err := f.h.svc.Mkdir(ctx, t.caller, t.id, req.Msg.GetPath(), userOf(req.Header()))
	if err != nil {
		if errors.Is(err, errdefs.ErrConflict) {
			return nil, connect.NewError(connect.CodeAlreadyExists, err)
		}
		return nil, connectError(err)
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: entryInfo(fi)}), nil
}

func (f *filesystemServer) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	t := targetOf(ctx)
	fi, err := f.h.svc.Move(ctx, t.caller, t.id, req.Msg.GetSource(), req.Msg.GetDestination())
	if err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&filesystem.MoveResponse{Entry: entryInfo(fi)}), nil
}

func (f *filesystemServer) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	t := targetOf(ctx)
	depth := int(req.Msg.GetDepth())
	if depth == 0 {
		depth = 1
	}
	st, err := f.h.svc.Stat(ctx, t.caller, t.id, req.Msg.GetPath())
	if err == nil && st.Type != "dir" {
		err = errdefs.InvalidArgument("path %s is not a directory", req.Msg.GetPath())
	}
	if err != nil {
		return nil, connectError(err)
	}
	list, err := f.h.svc.ListFiles(ctx, t.caller, t.id, req.Msg.GetPath(), min(depth, 10))
	if err != nil {
		return nil, connectError(err)
	}
	out := &filesystem.ListDirResponse{}
	for _, fi := range list {
		if fi.Path == st.Path {
			continue
		}
		out.Entries = append(out.Entries, entryInfo(fi))
	}
	return connect.NewResponse(out), nil
}

func (f *filesystemServer) Remove(ctx context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	t := targetOf(ctx)
	// envd removes with os.RemoveAll: a path that is not there is no
	// error (the sandbox itself was checked before the request got here).
	if err := f.h.svc.Remove(ctx, t.caller, t.id, req.Msg.GetPath(), true); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return nil, connectError(err)
	}
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}

// fsEvent maps a watch event to envd's, with the name relative to the
// watched directory.
func (f *filesystemServer) fsEvent(ctx context.Context, t envdTarget, dir string, ev agentproto.WatchEvent, withEntry bool) *filesystem.FilesystemEvent {
	name := strings.TrimPrefix(strings.TrimPrefix(ev.Path, dir), "/")
	if name == "" {
		name = path.Base(ev.Path)
	}
	out := &filesystem.FilesystemEvent{Name: name}
	switch ev.Type {
	case "create":
		out.Type = filesystem.EventType_EVENT_TYPE_CREATE
	case "write":
		out.Type = filesystem.EventType_EVENT_TYPE_WRITE
	case "remove":
		out.Type = filesystem.EventType_EVENT_TYPE_REMOVE
	case "rename":
		out.Type = filesystem.EventType_EVENT_TYPE_RENAME
	case "chmod":
		out.Type = filesystem.EventType_EVENT_TYPE_CHMOD
	}
	if withEntry && out.Type != filesystem.EventType_EVENT_TYPE_REMOVE && out.Type != filesystem.EventType_EVENT_TYPE_RENAME {
		if fi, err := f.h.svc.Stat(ctx, t.caller, t.id, ev.Path); err == nil {
			out.Entry = entryInfo(fi)
		}
	}
	return out
}

// watchDir resolves the directory a watch is for and opens it.
func (f *filesystemServer) watchDir(ctx context.Context, t envdTarget, p string, recursive bool) (string, interface {
	Next() (agentproto.WatchEvent, error)
	Close() error
}, error) {
	st, err := f.h.svc.Stat(ctx, t.caller, t.id, p)
	if err != nil {
		return "", nil, err
	}
	if st.Type != "dir" {
		return "", nil, errdefs.InvalidArgument("path %s is not a directory", p)
	}
	w, err := f.h.svc.Watch(ctx, t.caller, t.id, st.Path, recursive)
	return st.Path, w, err
}

func (f *filesystemServer) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], stream *connect.ServerStream[filesystem.WatchDirResponse]) error {
	t := targetOf(ctx)
	dir, w, err := f.watchDir(ctx, t, req.Msg.GetPath(), req.Msg.GetRecursive())
	if err != nil {
		return connectError(err)
	}
	defer w.Close()
	if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{Start: &filesystem.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	ch := pump(ctx, w.Next, 64)
	tick := time.NewTicker(keepaliveEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil // the client stopped watching (or its timeout ran out)
		case <-tick.C:
			if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Keepalive{Keepalive: &filesystem.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case it, ok := <-ch:
			if it.err != nil && f.h.sandboxEnded(t.id) {
				dropConnection() // the sandbox was killed under the watch: as E2B
			}
			if !ok || it.err == io.EOF {
				return nil
			}
			if it.err != nil {
				return connectError(it.err)
			}
			ev := f.fsEvent(ctx, t, dir, it.v, req.Msg.GetIncludeEntry())
			if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Filesystem{Filesystem: ev}}); err != nil {
				return err
			}
		}
	}
}

// watchers are the polling watches of CreateWatcher/GetWatcherEvents.
type watchers struct {
	mu sync.Mutex
	m  map[string]*watcher
}

type watcher struct {
	sandbox string
	cancel  context.CancelFunc
	// polled is when the watcher was made or last polled (watchers.mu).
	polled time.Time
	mu     sync.Mutex
	events []*filesystem.FilesystemEvent
	err    error
}

// maxWatcherEvents bounds a polling watcher's backlog; older events are
// dropped.
const maxWatcherEvents = 10000

// maxWatchers bounds a sandbox's polling watchers (the agent allows 64
// watches); watcherIdle is how long one nobody polls is kept. Each holds
// an agent watch, a goroutine and up to maxWatcherEvents events in the
// server: without the bounds a client creating watchers in a loop, or
// forgetting them, grew the server's memory for good.
var (
	maxWatchers = 64
	watcherIdle = 10 * time.Minute
)

func newWatchers() *watchers { return &watchers{m: map[string]*watcher{}} }

// sweep removes the watchers nobody polled for watcherIdle (ws.mu held).
func (ws *watchers) sweep(now time.Time) {
	for id, w := range ws.m {
		if now.Sub(w.polled) > watcherIdle {
			delete(ws.m, id)
			w.cancel()
		}
	}
}

// forget removes a sandbox's watchers (it was killed).
func (ws *watchers) forget(sandbox string) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for id, w := range ws.m {
		if w.sandbox == sandbox {
			delete(ws.m, id)
			w.cancel()
		}
	}
}

// add registers w under a new id unless its sandbox has maxWatchers.
func (ws *watchers) add(w *watcher) (string, error) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.sweep(w.polled)
	n := 0
	for _, o := range ws.m {
		if o.sandbox == w.sandbox {
			n++
		}
	}
	if n >= maxWatchers {
		return "", connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("sandbox has %d watchers; remove one first", n))
	}
	b := make([]byte, 12)
	rand.Read(b)
	id := hex.EncodeToString(b)
	ws.m[id] = w
	return id, nil
}

func (f *filesystemServer) CreateWatcher(ctx context.Context, req *connect.Request[filesystem.CreateWatcherRequest]) (*connect.Response[filesystem.CreateWatcherResponse], error) {
	t := targetOf(ctx)
	// The watch outlives this request: it ends with RemoveWatcher.
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	dir, w, err := f.watchDir(wctx, t, req.Msg.GetPath(), req.Msg.GetRecursive())
	if err != nil {
		cancel()
		return nil, connectError(err)
	}
	wt := &watcher{sandbox: t.id, cancel: func() { cancel(); w.Close() }, polled: time.Now()}
	id, err := f.h.watchers.add(wt)
	if err != nil {
		wt.cancel()
		return nil, err
	}
	withEntry := req.Msg.GetIncludeEntry()
	go func() {
		for {
			ev, err := w.Next()
			wt.mu.Lock()
			if err != nil {
				wt.err = err
				wt.mu.Unlock()
				return
			}
			wt.events = append(wt.events, f.fsEvent(wctx, t, dir, ev, withEntry))
			if len(wt.events) > maxWatcherEvents {
				wt.events = wt.events[len(wt.events)-maxWatcherEvents:]
			}
			wt.mu.Unlock()
		}
	}()
	return connect.NewResponse(&filesystem.CreateWatcherResponse{WatcherId: id}), nil
}

func (f *filesystemServer) watcher(ctx context.Context, id string) (*watcher, error) {
	f.h.watchers.mu.Lock()
	defer f.h.watchers.mu.Unlock()
	now := time.Now()
	f.h.watchers.sweep(now)
	w := f.h.watchers.m[id]
	if w == nil || w.sandbox != targetOf(ctx).id {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("watcher "+id+" not found"))
	}
	w.polled = now
	return w, nil
}

func (f *filesystemServer) GetWatcherEvents(ctx context.Context, req *connect.Request[filesystem.GetWatcherEventsRequest]) (*connect.Response[filesystem.GetWatcherEventsResponse], error) {
	w, err := f.watcher(ctx, req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	evs := w.events
	w.events = nil
	werr := w.err
	w.mu.Unlock()
	if len(evs) == 0 && werr != nil && werr != io.EOF {
		return nil, connectError(werr)
	}
	return connect.NewResponse(&filesystem.GetWatcherEventsResponse{Events: evs}), nil
}

func (f *filesystemServer) RemoveWatcher(ctx context.Context, req *connect.Request[filesystem.RemoveWatcherRequest]) (*connect.Response[filesystem.RemoveWatcherResponse], error) {
	w, err := f.watcher(ctx, req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	f.h.watchers.mu.Lock()
	delete(f.h.watchers.m, req.Msg.GetWatcherId())
	f.h.watchers.mu.Unlock()
	w.cancel()
	return connect.NewResponse(&filesystem.RemoveWatcherResponse{}), nil
}
