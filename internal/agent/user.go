package agent

import (
	"maps"
	"os"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/errdefs"
)

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// account is a resolved user.
type account struct {
	name   string
	uid    uint32
	gid    uint32
	groups []uint32
	home   string
}

// accountFiles are the files an account is resolved from.
var accountFiles = [2]string{"/etc/passwd", "/etc/group"}

// accounts caches resolved users. Parsing both files costs ~3 ms per exec
// inside gVisor (each open and read is a round trip to the gofer), while a
// stat of each, answered from the sentry's cache, tells whether either
// changed (a useradd in the sandbox, a restored snapshot), which empties
// the cache.
var accounts struct {
	mu     sync.Mutex
	stamps [2]fileStamp
	byName map[string]account
}

// fileStamp identifies a version of a file: a rewrite in place changes its
// size or times, a replacement (rename over it) its inode.
type fileStamp struct {
	dev, ino     uint64
	size         int64
	mtime, ctime unix.Timespec
}

func stampOf(path string) fileStamp {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fileStamp{} // a missing file is a version too
	}
	return fileStamp{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim, ctime: st.Ctim}
}

// lookupUser resolves name from /etc/passwd and /etc/group (os/user is pure
// Go in the static agent), through the accounts cache.
func lookupUser(name string) (account, error) {
	var stamps [2]fileStamp
	for i, f := range accountFiles {
		stamps[i] = stampOf(f)
	}
	accounts.mu.Lock()
	if accounts.stamps != stamps {
		accounts.stamps, accounts.byName = stamps, nil
	}
	a, ok := accounts.byName[name]
	accounts.mu.Unlock()
	if ok {
		return a, nil
	}
	a, err := readAccount(name)
	if err != nil {
		return a, err
	}
	accounts.mu.Lock()
	if accounts.stamps == stamps { // not changed again meanwhile
		if accounts.byName == nil {
			accounts.byName = map[string]account{}
		}
		accounts.byName[name] = a
	}
	accounts.mu.Unlock()
	return a, nil
}

// readAccount resolves name from the files (a variable for tests).
var readAccount = readAccountFiles

func readAccountFiles(name string) (account, error) {
	u, err := user.Lookup(name)
	if err != nil {
		if _, ok := err.(user.UnknownUserError); ok {
			return account{}, errdefs.InvalidArgument("unknown user %q", name)
		}
		return account{}, errdefs.Newf(errdefs.ErrInternal, "look up user %q: %v", name, err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return account{}, errdefs.Newf(errdefs.ErrInternal, "user %q has a non-numeric id", name)
	}
	a := account{name: u.Username, uid: uint32(uid), gid: uint32(gid), home: u.HomeDir}
	if ids, err := u.GroupIds(); err == nil {
		for _, s := range ids {
			if g, err := strconv.ParseUint(s, 10, 32); err == nil {
				a.groups = append(a.groups, uint32(g))
			}
		}
	}
	if a.home == "" {
		a.home = "/"
	}
	return a, nil
}

// credential returns the credential to run a process as a, or nil when the
// agent is not root (it can only run processes as itself then).
func (a account) credential() *syscall.Credential {
	if os.Geteuid() != 0 {
		return nil
	}
	return &syscall.Credential{Uid: a.uid, Gid: a.gid, Groups: a.groups}
}

// chown gives path to a when the agent is root; errors are ignored because
// some filesystems refuse ownership changes and that must not fail a write.
func (a account) chown(path string) {
	if os.Geteuid() == 0 {
		_ = os.Lchown(path, int(a.uid), int(a.gid))
	}
}

// buildEnv merges the default environment, the Init environment and the
// request's, later ones winning, into an exec-style list.
func buildEnv(a account, pty bool, layers ...map[string]string) []string {
	env := map[string]string{
		"PATH": defaultPath,
		"HOME": a.home,
		"USER": a.name,
		"LANG": "C.UTF-8",
	}
	if a.name != "" {
		env["LOGNAME"] = a.name
	}
	if pty {
		env["TERM"] = "xterm-256color"
	}
	for _, l := range layers {
		maps.Copy(env, l)
	}
	out := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out
}

func envGet(env []string, key string) string {
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}

// lookPath finds file in the PATH of the process's environment (not the
// agent's own), like exec.LookPath.
func lookPath(file, path, cwd string) (string, error) {
	if strings.Contains(file, "/") {
		if !strings.HasPrefix(file, "/") {
			file = cwd + "/" + file
		}
		if err := executable(file); err != nil {
			return "", errdefs.NotFound("%s: %v", file, err)
		}
		return file, nil
	}
	for dir := range strings.SplitSeq(path, ":") {
		if dir == "" {
			dir = "."
		}
		p := dir + "/" + file
		if !strings.HasPrefix(p, "/") {
			p = cwd + "/" + p
		}
		if executable(p) == nil {
			return p, nil
		}
	}
	return "", errdefs.NotFound("%s: executable file not found in $PATH", file)
}

func executable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return os.ErrPermission
	}
	return nil
}
