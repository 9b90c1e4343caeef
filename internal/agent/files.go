package agent

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/errdefs"
)

const (
	maxListDepth   = 10
	maxListEntries = 10000
)

// resolve validates a request path and makes it absolute: relative paths
// are taken from the home directory; NUL bytes and ".." segments are
// refused rather than cleaned away, so a path never escapes where it looks
// like it points.
func (a *Agent) resolve(p string) (string, error) {
	if p == "" {
		return "", errdefs.InvalidArgument("path is required")
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", errdefs.InvalidArgument("path contains a NUL byte")
	}
	for seg := range strings.SplitSeq(p, "/") {
		if seg == ".." {
			return "", errdefs.InvalidArgument("path %q contains a .. segment", p)
		}
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(a.opts.Home, p)
	}
	return filepath.Clean(p), nil
}

// owner resolves the ?user= of a file request (the default user when empty).
func (a *Agent) owner(name string) (account, error) {
	if name == "" {
		name = a.opts.User
	}
	return lookupUser(name)
}

// names caches uid → user name within one request.
type names map[uint32]string

func (n names) lookup(uid uint32) string {
	if s, ok := n[uid]; ok {
		return s
	}
	s := strconv.FormatUint(uint64(uid), 10)
	if u, err := user.LookupId(s); err == nil {
		s = u.Username
	}
	n[uid] = s
	return s
}

func fileInfo(path string, fi fs.FileInfo, n names) agentproto.FileInfo {
	info := agentproto.FileInfo{
		Name:    fi.Name(),
		Path:    path,
		Size:    fi.Size(),
		Mode:    uint32(fi.Mode().Perm()),
		ModTime: fi.ModTime().UTC(),
	}
	switch m := fi.Mode(); {
	case m.IsRegular():
		info.Type = "file"
	case m.IsDir():
		info.Type = "dir"
	case m&fs.ModeSymlink != 0:
		info.Type = "symlink"
		info.Target, _ = os.Readlink(path)
	default:
		info.Type = "other"
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && n != nil {
		info.Owner = n.lookup(st.Uid)
	}
	return info
}

// writeStat answers with path's FileInfo.
func writeStat(w http.ResponseWriter, path string) {
	info, err := stat(path)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, info)
}

func stat(path string) (agentproto.FileInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return agentproto.FileInfo{}, osError(err)
	}
	return fileInfo(path, fi, names{}), nil
}

// mkdirAll creates dir and its missing parents, giving each created one
// to acct.
func mkdirAll(dir string, acct account) error {
	fi, err := os.Stat(dir)
	if err == nil {
		if !fi.IsDir() {
			return errdefs.Conflict("%s exists and is not a directory", dir)
		}
		return nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return osError(err)
	}
	if parent := filepath.Dir(dir); parent != dir {
		if err := mkdirAll(parent, acct); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		if errors.Is(err, fs.ErrExist) {
			if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
				return nil // created concurrently
			}
		}
		return osError(err)
	}
	acct.chown(dir)
	return nil
}

func (a *Agent) handleRead(w http.ResponseWriter, r *http.Request) {
	path, err := a.resolve(r.URL.Query().Get("path"))
	if err != nil {
		writeError(w, err)
		return
	}
	// O_NONBLOCK: opening a FIFO for reading would otherwise wait for a
	// writer, holding this request and a thread of the agent forever.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		writeError(w, osError(err))
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		writeError(w, osError(err))
		return
	}
	if fi.IsDir() {
		writeError(w, errdefs.InvalidArgument("%s is a directory", path))
		return
	}
	if !fi.Mode().IsRegular() {
		// FIFOs, sockets and devices (/dev/zero would never end).
		writeError(w, errdefs.InvalidArgument("%s is not a regular file (%s)", path, fi.Mode().Type()))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	// Pseudo files (/proc, /sys) stat as empty regular files yet have
	// content: only a non-zero size is trusted as the length.
	if fi.Mode().IsRegular() && fi.Size() > 0 {
		w.Header().Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
	}
	w.WriteHeader(http.StatusOK)
	defer abortOnDone(r, http.NewResponseController(w))()
	buf := make([]byte, 256<<10)
	_, _ = io.CopyBuffer(struct{ io.Writer }{w}, struct{ io.Reader }{f}, buf)
}

// sparseBlock is the unit copySparse reads, and leaves as a hole when it is
// all zeros.
const sparseBlock = 256 << 10

var zeroBlock [sparseBlock]byte

// copySparse copies src into f, a new empty file, leaving a hole for every
// whole block of zeros instead of writing it, as `cp --sparse=auto` does: a
// restored sparse file (a VM image, a database's preallocation) stays
// sparse, and its zeros cost the sandbox neither disk nor memory. Write,
// seek and truncate errors are f's *fs.PathError; others are src's.
func copySparse(f *os.File, src io.Reader) (int64, error) {
	buf := make([]byte, sparseBlock)
	var n int64
	hole := false // the file ends in a hole: its size needs setting
	for {
		k, rerr := fill(src, buf)
		if k == len(buf) && bytes.Equal(buf, zeroBlock[:]) {
			if _, err := f.Seek(int64(k), io.SeekCurrent); err != nil {
				return n, err
			}
			hole = true
		} else if k > 0 {
			if _, err := f.Write(buf[:k]); err != nil {
				return n, err
			}
			hole = false
		}
		n += int64(k)
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return n, rerr
		}
	}
	if hole {
		if err := f.Truncate(n); err != nil {
			return n, err
		}
	}
	return n, nil
}

// fill reads into buf until it is full or src ends: io.EOF once nothing
// more comes, any other error as src gave it. (io.ReadFull would turn a
// short final read into io.ErrUnexpectedEOF, which is also what a body cut
// short of its length reads as: the two must stay apart.)
func fill(src io.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		k, err := src.Read(buf[n:])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// tempPrefix names the temporary file a write fills before its rename.
// The letter after it says whether the write replaces a file (tempOver)
// or makes a new one (tempNew): a watch reports the rename as what the
// caller did to the target (a write, or a create and a write), and hides
// the temporary file's own events (watch.go).
const (
	tempPrefix = ".space-write-"
	tempNew    = 'c'
	tempOver   = 'w'
)

// tempName is the temporary file's name pattern ("*" is random) for a
// write to a target that exists (over) or not.
func tempName(over bool) string {
	if over {
		return tempPrefix + string(tempOver) + "*"
	}
	return tempPrefix + string(tempNew) + "*"
}

// asTarget makes an error about a write's temporary file (or its rename)
// name the file the caller asked for: ".space-write-…" means nothing to
// the caller.
func asTarget(err error, path string) error {
	var le *os.LinkError
	if errors.As(err, &le) && strings.Contains(le.Old, tempPrefix) {
		return &fs.PathError{Op: "write", Path: path, Err: le.Err}
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		if strings.Contains(pe.Path, tempPrefix) {
			return &fs.PathError{Op: pe.Op, Path: path, Err: pe.Err}
		}
		return err
	}
	var errno syscall.Errno
	if errors.As(err, &errno) { // a bare system call's (openat, renameat)
		return &fs.PathError{Op: "write", Path: path, Err: errno}
	}
	return err
}

// handleWrite streams the body into a temporary file next to the target
// and renames it into place, so readers never see a half-written file.
func (a *Agent) handleWrite(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	path, err := a.resolve(q.Get("path"))
	if err != nil {
		writeError(w, err)
		return
	}
	acct, err := a.owner(q.Get("user"))
	if err != nil {
		writeError(w, err)
		return
	}
	mode := os.FileMode(0o644)
	if s := q.Get("mode"); s != "" {
		m, err := strconv.ParseUint(s, 8, 32)
		if err != nil || m > 0o7777 {
			writeError(w, errdefs.InvalidArgument("bad mode %q (octal)", s))
			return
		}
		mode = unixMode(uint32(m))
	}
	if q.Get("nofollow") == "1" {
		if err := writeNoFollow(path, r.Body, acct, mode, q.Get("mode") == ""); err != nil {
			writeError(w, err)
			return
		}
		writeStat(w, path)
		return
	}
	if q.Get("mode") == "" {
		if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() {
			mode = fi.Mode().Perm() // overwriting keeps the mode
		}
	}
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		writeError(w, errdefs.Conflict("%s is a directory", path))
		return
	}
	over := false
	if fi, err := os.Lstat(path); err == nil && !fi.Mode().IsRegular() && fi.Mode()&fs.ModeSymlink == 0 {
		// A device, FIFO or socket is not replaced by a file (/dev/null
		// became a file anyone could read).
		writeError(w, errdefs.InvalidArgument("%s is not a regular file", path))
		return
	} else if err == nil {
		over = true
	}
	dir := filepath.Dir(path)
	if err := mkdirAll(dir, acct); err != nil {
		writeError(w, err)
		return
	}
	tmp, err := os.CreateTemp(dir, tempName(over))
	if err != nil {
		writeError(w, osError(asTarget(err, path)))
		return
	}
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := copySparse(tmp, r.Body); err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			writeError(w, osError(asTarget(err, path)))
		} else {
			writeError(w, errdefs.InvalidArgument("read body: %v", err))
		}
		return
	}
	acct.chown(tmp.Name()) // before the mode: a chown clears setuid and setgid
	if err := tmp.Chmod(mode); err != nil {
		writeError(w, osError(asTarget(err, path)))
		return
	}
	if err := tmp.Close(); err != nil {
		writeError(w, osError(asTarget(err, path)))
		return
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		writeError(w, osError(asTarget(err, path)))
		return
	}
	ok = true
	writeStat(w, path)
}

func (a *Agent) handleStat(w http.ResponseWriter, r *http.Request) {
	path, err := a.resolve(r.URL.Query().Get("path"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeStat(w, path)
}

// handleList lists a directory to ?depth= levels (1: direct children),
// without following symlinked directories.
func (a *Agent) handleList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	path, err := a.resolve(q.Get("path"))
	if err != nil {
		writeError(w, err)
		return
	}
	depth := 1
	if s := q.Get("depth"); s != "" {
		if depth, err = strconv.Atoi(s); err != nil {
			writeError(w, errdefs.InvalidArgument("bad depth %q", s))
			return
		}
	}
	depth = min(max(depth, 1), maxListDepth)
	fi, err := os.Stat(path)
	if err != nil {
		writeError(w, osError(err))
		return
	}
	if !fi.IsDir() {
		writeError(w, errdefs.InvalidArgument("%s is not a directory", path))
		return
	}
	out := []agentproto.FileInfo{}
	n := names{}
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		entries, err := os.ReadDir(dir)
		if err != nil {
			if level > 1 {
				return nil // unreadable subdirectory: list what we can
			}
			return osError(err)
		}
		for _, e := range entries {
			if len(out) >= maxListEntries {
				return nil
			}
			p := filepath.Join(dir, e.Name())
			fi, err := e.Info()
			if err != nil {
				continue // removed meanwhile
			}
			out = append(out, fileInfo(p, fi, n))
			if e.IsDir() && level < depth {
				if err := walk(p, level+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(path, 1); err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, out)
}

func (a *Agent) handleMkdir(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	path, err := a.resolve(q.Get("path"))
	if err != nil {
		writeError(w, err)
		return
	}
	acct, err := a.owner(q.Get("user"))
	if err != nil {
		writeError(w, err)
		return
	}
	if q.Get("nofollow") == "1" {
		fd, err := openDirNoFollow(path, true, acct)
		if err != nil {
			writeError(w, err)
			return
		}
		unix.Close(fd)
	} else if err := mkdirAll(path, acct); err != nil {
		writeError(w, err)
		return
	}
	writeStat(w, path)
}

func (a *Agent) handleMove(w http.ResponseWriter, r *http.Request) {
	var req agentproto.MoveRequest
	if err := readJSON(r, &req); err != nil {
		writeError(w, err)
		return
	}
	from, err := a.resolve(req.From)
	if err != nil {
		writeError(w, err)
		return
	}
	to, err := a.resolve(req.To)
	if err != nil {
		writeError(w, err)
		return
	}
	acct, err := a.owner(req.User)
	if err != nil {
		writeError(w, err)
		return
	}
	if _, err := os.Lstat(from); err != nil {
		writeError(w, osError(err))
		return
	}
	if err := mkdirAll(filepath.Dir(to), acct); err != nil {
		writeError(w, err)
		return
	}
	if err := os.Rename(from, to); err != nil {
		writeError(w, osError(err))
		return
	}
	info, err := stat(to)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, info)
}

func (a *Agent) handleRemove(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	path, err := a.resolve(q.Get("path"))
	if err != nil {
		writeError(w, err)
		return
	}
	if path == "/" {
		writeError(w, errdefs.InvalidArgument("refusing to remove /"))
		return
	}
	if q.Get("nofollow") == "1" {
		if err := removeNoFollow(path, q.Get("recursive") == "1"); err != nil {
			writeError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
		return
	}
	fi, err := os.Lstat(path)
	if err != nil {
		writeError(w, osError(err))
		return
	}
	if fi.IsDir() && q.Get("recursive") == "1" {
		err = os.RemoveAll(path)
	} else {
		err = os.Remove(path)
	}
	if err != nil {
		writeError(w, osError(err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// unixMode is a numeric Unix mode (with its setuid, setgid and sticky
// bits) as an os.FileMode: os.FileMode(0o4755) is 0755 to Chmod, which
// sets those bits only from their os.Mode* flags, so a write with mode
// 4755 or 1777 silently lost them.
func unixMode(m uint32) os.FileMode {
	mode := os.FileMode(m & 0o777)
	if m&0o4000 != 0 {
		mode |= os.ModeSetuid
	}
	if m&0o2000 != 0 {
		mode |= os.ModeSetgid
	}
	if m&0o1000 != 0 {
		mode |= os.ModeSticky
	}
	return mode
}
