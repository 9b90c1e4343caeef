package agent

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/errdefs"
)

// The files a restore writes come from a snapshot the sandbox's own code
// shaped, and the agent writes them as root: a directory replaced by a
// symbolic link (~/d → /etc) would send them anywhere. With ?nofollow=1 a
// write, mkdir or remove walks its path from / one component at a time,
// opening each with O_NOFOLLOW relative to the one before, so no symbolic
// link on the way is followed, even one swapped in while it runs; the file
// is created, renamed or unlinked relative to the last directory.

// errCrossesLink is a nofollow path with a symbolic link (or a file) where
// a directory should be.
func errCrossesLink(path string) error {
	return errdefs.InvalidArgument("%s: a component of the path is a symbolic link or not a directory (not followed)", path)
}

// openDirNoFollow opens dir (absolute, clean) without following a link in
// any component, creating missing ones (given to acct) when create is set.
//
// Not O_DIRECTORY: gVisor (runsc 2026-09) follows a link opened with
// O_DIRECTORY|O_NOFOLLOW where Linux fails with ENOTDIR (checked in a
// sandbox); O_NOFOLLOW alone gives ELOOP there as here, and fstat tells a
// directory.
func openDirNoFollow(dir string, create bool, acct account) (int, error) {
	// O_NONBLOCK: a FIFO swapped in for a directory would block the open
	// (waiting for a writer) for good, with the restore holding the
	// sandbox's lifecycle lock; with it the open returns and fstat refuses
	// what is not a directory.
	const flags = unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_CLOEXEC | unix.O_NONBLOCK
	fd, err := unix.Open("/", flags|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, osError(err)
	}
	for _, comp := range strings.Split(strings.TrimPrefix(dir, "/"), "/") {
		if comp == "" {
			continue
		}
		nfd, err := unix.Openat(fd, comp, flags, 0)
		if errors.Is(err, unix.ENOENT) && create {
			err = unix.Mkdirat(fd, comp, 0o755)
			if err == nil {
				_ = unix.Fchownat(fd, comp, int(acct.uid), int(acct.gid), unix.AT_SYMLINK_NOFOLLOW)
			}
			if err == nil || errors.Is(err, unix.EEXIST) {
				nfd, err = unix.Openat(fd, comp, flags, 0)
			}
		}
		unix.Close(fd)
		if err == nil {
			var st unix.Stat_t
			if err = unix.Fstat(nfd, &st); err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
				err = unix.ENOTDIR
			}
			if err != nil {
				unix.Close(nfd)
			}
		}
		if err != nil {
			if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
				return -1, errCrossesLink(dir)
			}
			return -1, osError(err)
		}
		fd = nfd
	}
	return fd, nil
}

// writeNoFollow writes body to path (absolute, clean) as acct's file with
// mode (keepMode: an existing file's mode if it is one), without following
// a link: a link at path itself is replaced, not written through.
func writeNoFollow(path string, body io.Reader, acct account, mode os.FileMode, keepMode bool) error {
	dirfd, err := openDirNoFollow(filepath.Dir(path), true, acct)
	if err != nil {
		return err
	}
	defer unix.Close(dirfd)
	base := filepath.Base(path)
	var st unix.Stat_t
	over := false
	if err := unix.Fstatat(dirfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
		over = true
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			return errdefs.Conflict("%s is a directory", path)
		case unix.S_IFREG:
			if keepMode {
				mode = unixMode(st.Mode & 0o7777)
			}
		}
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := strings.TrimSuffix(tempName(over), "*") + hex.EncodeToString(rnd[:])
	fd, err := unix.Openat(dirfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return osError(asTarget(err, path))
	}
	f := os.NewFile(uintptr(fd), tmp)
	ok := false
	defer func() {
		if !ok {
			f.Close()
			_ = unix.Unlinkat(dirfd, tmp, 0)
		}
	}()
	if _, err := copySparse(f, body); err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			return osError(asTarget(err, path))
		}
		return errdefs.InvalidArgument("read body: %v", err)
	}
	if os.Geteuid() == 0 { // before the mode: a chown clears setuid and setgid
		_ = f.Chown(int(acct.uid), int(acct.gid))
	}
	if err := f.Chmod(mode); err != nil {
		return osError(asTarget(err, path))
	}
	if err := f.Close(); err != nil {
		return osError(asTarget(err, path))
	}
	if err := unix.Renameat(dirfd, tmp, dirfd, base); err != nil {
		return osError(asTarget(err, path))
	}
	ok = true
	return nil
}

// symlinkNoFollow makes path (absolute, clean) a symbolic link to target,
// owned by acct, replacing what is there unless it is a directory.
func symlinkNoFollow(path, target string, acct account) error {
	dirfd, err := openDirNoFollow(filepath.Dir(path), true, acct)
	if err != nil {
		return err
	}
	defer unix.Close(dirfd)
	base := filepath.Base(path)
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := ".space-link-" + hex.EncodeToString(rnd[:])
	if err := unix.Symlinkat(target, dirfd, tmp); err != nil {
		return osError(err)
	}
	_ = unix.Fchownat(dirfd, tmp, int(acct.uid), int(acct.gid), unix.AT_SYMLINK_NOFOLLOW)
	if err := unix.Renameat(dirfd, tmp, dirfd, base); err != nil {
		_ = unix.Unlinkat(dirfd, tmp, 0)
		return osError(err)
	}
	return nil
}

func (a *Agent) handleSymlink(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	path, err := a.resolve(q.Get("path"))
	if err != nil {
		writeError(w, err)
		return
	}
	target := q.Get("target")
	if target == "" || strings.IndexByte(target, 0) >= 0 {
		writeError(w, errdefs.InvalidArgument("target: required, without NUL bytes"))
		return
	}
	acct, err := a.owner(q.Get("user"))
	if err != nil {
		writeError(w, err)
		return
	}
	if err := symlinkNoFollow(path, target, acct); err != nil {
		writeError(w, err)
		return
	}
	writeStat(w, path)
}

// removeNoFollow removes path (absolute, clean), and with recursive what a
// directory there holds, without following a link: not in path's
// directories (a restore's removal of ~/d/passwd after the sandbox made ~/d
// a link to /etc would remove /etc/passwd), not at path (the link itself
// goes), not inside the tree.
func removeNoFollow(path string, recursive bool) error {
	dirfd, err := openDirNoFollow(filepath.Dir(path), false, account{})
	if err != nil {
		return err
	}
	defer unix.Close(dirfd)
	base := filepath.Base(path)
	fail := func(err error) error {
		if err == nil {
			return nil
		}
		return osError(&fs.PathError{Op: "remove", Path: path, Err: err})
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fail(err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return fail(unix.Unlinkat(dirfd, base, 0))
	case !recursive:
		return fail(unix.Unlinkat(dirfd, base, unix.AT_REMOVEDIR))
	}
	return fail(removeAllAt(dirfd, base))
}

// removeAllAt removes name in the directory dirfd and, if it is a
// directory, everything in it, each entry relative to its own directory's
// descriptor, opened with O_NOFOLLOW (a link met is unlinked, never
// entered).
func removeAllAt(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return err
	}
	// A directory: empty it, then remove it. Entries the sandbox adds
	// meanwhile fail the rmdir; a few rounds take them too.
	for round := 0; ; round++ {
		fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0) // a FIFO: see openDirNoFollow
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		if errors.Is(err, unix.ELOOP) {
			// It became a link since: unlink the link.
			return unix.Unlinkat(dirfd, name, 0)
		}
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			unix.Close(fd)
			return unix.Unlinkat(dirfd, name, 0)
		}
		d := os.NewFile(uintptr(fd), name)
		names, err := d.Readdirnames(-1)
		if err != nil {
			d.Close()
			return err
		}
		for _, n := range names {
			if err := removeAllAt(int(d.Fd()), n); err != nil {
				d.Close()
				return err
			}
		}
		d.Close()
		err = unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.ENOTEMPTY) || round == 3 {
			return err
		}
	}
}
