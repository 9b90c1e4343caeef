package agent

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/errdefs"
)

const watchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_DELETE | unix.IN_MOVED_FROM |
	unix.IN_MOVED_TO | unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR

// Limits of file watching: each watched directory costs the agent memory
// and the walk that adds it (a recursive watch of / is tens of thousands),
// and 3,000 such watches at once kept an agent busy for a quarter of an
// hour.
const (
	maxWatches   = 64   // watch streams open at once per sandbox
	maxWatchDirs = 8192 // directories one watch may hold
)

// watcher is one inotify instance with its watch descriptors.
type watcher struct {
	ctx       context.Context // the request: a walk stops when its client is gone
	f         *os.File        // the inotify fd, non-blocking so reads park in the poller and Close wakes them
	fd        int
	recursive bool
	dirs      map[int]string // wd → directory
}

// errTooManyDirs ends the walk of a tree larger than maxWatchDirs.
var errTooManyDirs = errors.New("too many directories")

// add watches dir and, for a recursive watch, its subdirectories. found,
// when not nil, is called with every entry already in them: a directory
// created or moved into the tree after the watch began may be filled before
// its own watch is in place (`mkdir -p a/b && echo > a/b/f` in one go), and
// inotify never reports what was there before. An entry created while its
// directory is being added can therefore be reported twice, never not at all.
func (w *watcher) add(dir string, found func(path string)) error {
	if err := w.ctx.Err(); err != nil {
		return err
	}
	if len(w.dirs) >= maxWatchDirs {
		return errTooManyDirs
	}
	wd, err := unix.InotifyAddWatch(w.fd, dir, watchMask)
	if err != nil {
		return err
	}
	w.dirs[wd] = dir
	if !w.recursive {
		return nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if found != nil {
			found(p)
		}
		if e.IsDir() { // DirEntry type: symlinked directories are not followed
			if err := w.add(p, found); errors.Is(err, errTooManyDirs) || w.ctx.Err() != nil {
				return err
			}
		}
	}
	return nil
}

// handleWatch streams inotify events for a directory as NDJSON until the
// client goes away. The response headers are sent once the watches are in
// place, so a client may change files as soon as Watch returns.
func (a *Agent) handleWatch(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	path, err := a.resolve(q.Get("path"))
	if err != nil {
		writeError(w, err)
		return
	}
	fi, err := os.Stat(path)
	if err != nil {
		writeError(w, osError(err))
		return
	}
	if !fi.IsDir() {
		writeError(w, errdefs.InvalidArgument("%s is not a directory", path))
		return
	}
	if a.watches.Add(1) > maxWatches {
		a.watches.Add(-1)
		writeError(w, errdefs.Unavailable("%d file watches are open in this sandbox, the most at once; end one first", maxWatches))
		return
	}
	defer a.watches.Add(-1)
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		writeError(w, errdefs.Newf(classOf(err), "inotify: %v", err))
		return
	}
	wt := &watcher{ctx: r.Context(), f: os.NewFile(uintptr(fd), "inotify"), fd: fd, recursive: q.Get("recursive") == "1", dirs: map[int]string{}}
	defer wt.f.Close()
	if err := wt.add(path, nil); err != nil {
		if errors.Is(err, errTooManyDirs) {
			writeError(w, errdefs.Newf(errdefs.ErrTooLarge, "%s holds more than %d directories: watch a smaller tree", path, maxWatchDirs))
			return
		}
		writeError(w, osError(&os.PathError{Op: "watch", Path: path, Err: err}))
		return
	}
	stop := context.AfterFunc(r.Context(), func() { wt.f.Close() })
	defer stop()

	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	defer abortOnDone(r, rc)()
	if rc.Flush() != nil {
		return
	}
	enc := json.NewEncoder(w)
	buf := make([]byte, 64<<10)
	own := ownWrites{}
	for {
		n, err := wt.f.Read(buf)
		if err != nil {
			return
		}
		now := time.Now().UTC()
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			nameBytes := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			off += unix.SizeofInotifyEvent + int(ev.Len)
			dir, ok := wt.dirs[int(ev.Wd)]
			if ev.Mask&unix.IN_IGNORED != 0 {
				delete(wt.dirs, int(ev.Wd))
				continue
			}
			if !ok {
				continue
			}
			name := unix.ByteSliceToString(nameBytes)
			p := dir
			if name != "" {
				p = filepath.Join(dir, name)
			}
			types, mine := own.events(ev, name)
			if !mine {
				types = []string{watchType(ev.Mask)}
			}
			for _, typ := range types {
				if typ == "" {
					continue
				}
				if err := enc.Encode(agentproto.WatchEvent{Type: typ, Path: p, Time: now}); err != nil {
					return
				}
			}
			if wt.recursive && ev.Mask&unix.IN_ISDIR != 0 && ev.Mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0 {
				var found []string
				_ = wt.add(p, func(q string) { found = append(found, q) })
				for _, q := range found {
					if err := enc.Encode(agentproto.WatchEvent{Type: "create", Path: q, Time: now}); err != nil {
						return
					}
				}
			}
		}
		if rc.Flush() != nil {
			return
		}
	}
}

func watchType(mask uint32) string {
	switch {
	case mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
		return "create"
	case mask&unix.IN_MODIFY != 0:
		return "write"
	case mask&(unix.IN_DELETE|unix.IN_DELETE_SELF) != 0:
		return "remove"
	case mask&(unix.IN_MOVED_FROM|unix.IN_MOVE_SELF) != 0:
		return "rename"
	case mask&unix.IN_ATTRIB != 0:
		return "chmod"
	}
	return ""
}

// ownWrites tells the agent's own atomic writes (handleWrite: a temporary
// file next to the target, renamed over it) apart in a watch, so that a
// watch reports what the caller did to the target, as envd (which writes
// in place) does: a write over a file is a "write" of it, a new file a
// "create" and a "write". The temporary file's own events (create, write,
// chmod, the rename away) are not reported. It maps the rename cookies of
// temporary files moved away to the letter saying which kind of write
// they were (tempNew or tempOver).
type ownWrites map[uint32]byte

// events returns the event types to report for ev (of the entry name in
// a watched directory) and whether it was part of an own write.
func (o ownWrites) events(ev *unix.InotifyEvent, name string) ([]string, bool) {
	if rest, ok := strings.CutPrefix(name, tempPrefix); ok {
		if ev.Mask&unix.IN_MOVED_FROM != 0 && rest != "" {
			if len(o) > 64 { // renamed out of the watched tree: never paired
				clear(o)
			}
			o[ev.Cookie] = rest[0]
		}
		return nil, true
	}
	if ev.Mask&unix.IN_MOVED_TO == 0 {
		return nil, false
	}
	kind, ok := o[ev.Cookie]
	if !ok {
		return nil, false
	}
	delete(o, ev.Cookie)
	switch kind {
	case tempOver:
		return []string{"write"}, true
	case tempNew:
		return []string{"create", "write"}, true
	}
	return nil, false // an older agent's temporary file: a plain rename
}
