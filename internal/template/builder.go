package template

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
)

// Kind names the form of a template artifact; a driver asks for the kind
// it consumes.
type Kind string

const (
	// KindDir is a root filesystem directory (Template.Path), used by gVisor.
	KindDir Kind = "dir"
	// KindRaw will be an ext4 image of the same rootfs for VM drivers
	// (QEMU, Firecracker). Extension point: a Builder step that runs
	// `mkfs.ext4 -d <rootfs>` into <cache>/<digest>/rootfs.ext4 under the
	// same lock, recorded in template.json; not built yet.
	KindRaw Kind = "raw"
)

// Template is a built template in the cache.
type Template struct {
	Name      string    `json:"name"`
	Digest    string    `json:"digest"`
	Path      string    `json:"-"` // the rootfs directory; derived from the cache location
	Kind      Kind      `json:"kind"`
	SizeBytes int64     `json:"size_bytes"`
	Recipe    Recipe    `json:"recipe"`
	BuiltAt   time.Time `json:"built_at"`
	// BuildSeconds is how long the build took (for the operator; not part
	// of the template's identity).
	BuildSeconds float64 `json:"build_seconds,omitempty"`
}

// DefaultCacheDir is where a server keeps templates unless told otherwise.
const DefaultCacheDir = "/var/cache/space/templates"

// Cache layout names.
const (
	rootfsDir    = "rootfs"
	metadataFile = "template.json" // written last: its presence marks a complete build
)

// Builder builds templates into a cache directory. It is safe for
// concurrent use, and several processes may share one cache directory.
type Builder struct {
	dir string
	// builds counts mmdebstrap runs (tests check builds are not repeated).
	builds atomic.Int64
}

// NewBuilder returns a Builder caching in dir (created if needed).
func NewBuilder(dir string) (*Builder, error) {
	if dir == "" {
		return nil, errdefs.InvalidArgument("template cache dir is empty")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("template cache dir: %w", err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("template cache dir: %w", err)
	}
	return &Builder{dir: abs}, nil
}

// Dir is the cache directory.
func (b *Builder) Dir() string { return b.dir }

// EnsureTools checks that the build tools are installed. Errors:
// errdefs.ErrUnavailable naming what is missing (installing it is the
// Makefile's job: `make deps`).
func EnsureTools(ctx context.Context) error {
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		return errdefs.Unavailable("mmdebstrap is not installed (apt-get install mmdebstrap); templates cannot be built")
	}
	if os.Geteuid() != 0 {
		return errdefs.Unavailable("template builds need root (mmdebstrap --mode=root)")
	}
	return nil
}

var digestRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Lookup returns the cached template with the given digest. Errors:
// errdefs.ErrNotFound if it is not built (or not completely),
// errdefs.ErrInvalidArgument for a malformed digest.
func (b *Builder) Lookup(digest string) (Template, error) {
	if !digestRE.MatchString(digest) {
		return Template{}, errdefs.InvalidArgument("malformed template digest %q", digest)
	}
	dir := filepath.Join(b.dir, digest)
	data, err := os.ReadFile(filepath.Join(dir, metadataFile))
	if errors.Is(err, fs.ErrNotExist) {
		return Template{}, errdefs.NotFound("template %s is not built", digest)
	}
	if err != nil {
		return Template{}, fmt.Errorf("template %s: %w", digest, err)
	}
	var t Template
	if err := json.Unmarshal(data, &t); err != nil {
		return Template{}, fmt.Errorf("template %s: corrupt %s: %w", digest, metadataFile, err)
	}
	if t.Digest != digest {
		return Template{}, fmt.Errorf("template %s: %s names digest %s", digest, metadataFile, t.Digest)
	}
	t.Path = filepath.Join(dir, rootfsDir)
	return t, nil
}

// List returns every complete template in the cache, oldest build first.
func (b *Builder) List() ([]Template, error) {
	entries, err := os.ReadDir(b.dir)
	if err != nil {
		return nil, fmt.Errorf("template cache: %w", err)
	}
	var out []Template
	for _, e := range entries {
		if !e.IsDir() || !digestRE.MatchString(e.Name()) {
			continue
		}
		t, err := b.Lookup(e.Name())
		if errors.Is(err, errdefs.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b Template) int { return a.BuiltAt.Compare(b.BuiltAt) })
	return out, nil
}

// Build returns the template for recipe r, building it unless the cache
// has it. progress, if not nil, receives each line of build output.
// Concurrent builds of one recipe (in this process or others sharing the
// cache) build once: the others wait and return the cached result. A failed
// or cancelled build leaves nothing in the cache; cancelling ctx kills the
// build. Errors: errdefs.ErrInvalidArgument for a bad recipe or one apt
// cannot satisfy (unknown package), errdefs.ErrUnavailable when the tools
// are missing or the mirror cannot be reached, and the ctx error when
// cancelled.
func (b *Builder) Build(ctx context.Context, r Recipe, progress func(line string)) (Template, error) {
	if progress == nil {
		progress = func(string) {}
	}
	if err := r.Validate(); err != nil {
		return Template{}, err
	}
	r = r.normalized()
	digest := r.Digest()
	if t, err := b.Lookup(digest); err == nil {
		progress(fmt.Sprintf("template %s: cached (%s)", r.Name, digest[:12]))
		return t, nil
	}
	if err := EnsureTools(ctx); err != nil {
		return Template{}, err
	}

	unlock, err := lockFile(ctx, filepath.Join(b.dir, digest+".lock"))
	if err != nil {
		return Template{}, err
	}
	defer unlock()

	// Another builder may have finished while we waited for the lock.
	if t, err := b.Lookup(digest); err == nil {
		progress(fmt.Sprintf("template %s: built by another builder (%s)", r.Name, digest[:12]))
		return t, nil
	}
	return b.buildLocked(ctx, r, digest, progress)
}

// buildLocked builds r; the caller holds the digest's lock.
func (b *Builder) buildLocked(ctx context.Context, r Recipe, digest string, progress func(string)) (t Template, err error) {
	final := filepath.Join(b.dir, digest)
	// We hold the lock, so anything left for this digest is debris from a
	// crashed builder: an unfinished final dir (no marker) or temp dirs.
	if err := removeTree(final); err != nil {
		return Template{}, err
	}
	stale, _ := filepath.Glob(filepath.Join(b.dir, "."+digest+".tmp-*"))
	for _, d := range stale {
		if err := removeTree(d); err != nil {
			return Template{}, err
		}
	}

	tmp, err := os.MkdirTemp(b.dir, "."+digest+".tmp-")
	if err != nil {
		return Template{}, fmt.Errorf("template build: %w", err)
	}
	defer func() {
		if err != nil {
			if rerr := removeTree(tmp); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
	}()

	start := time.Now()
	progress(fmt.Sprintf("template %s: building %s with mmdebstrap (variant %s, %d packages)", r.Name, digest[:12], r.Variant, len(r.Packages)))
	b.builds.Add(1)
	rootfs := filepath.Join(tmp, rootfsDir)
	if err := runMmdebstrap(ctx, r, rootfs, progress); err != nil {
		return Template{}, err
	}
	if _, err := os.Lstat(filepath.Join(rootfs, "bin", "sh")); err != nil {
		return Template{}, fmt.Errorf("template %s: built rootfs has no /bin/sh: %w", r.Name, errdefs.ErrInternal)
	}
	size, err := diskUsage(rootfs)
	if err != nil {
		return Template{}, fmt.Errorf("template %s: size: %w", r.Name, err)
	}
	t = Template{
		Name:         r.Name,
		Digest:       digest,
		Kind:         KindDir,
		SizeBytes:    size,
		Recipe:       r,
		BuiltAt:      time.Now().UTC(),
		BuildSeconds: time.Since(start).Seconds(),
	}
	if err := syncFS(rootfs); err != nil {
		return Template{}, fmt.Errorf("template %s: sync: %w", r.Name, err)
	}
	data, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		return Template{}, fmt.Errorf("template %s: %w", r.Name, err)
	}
	if err := writeFileSync(filepath.Join(tmp, metadataFile), data); err != nil {
		return Template{}, fmt.Errorf("template %s: write metadata: %w", r.Name, err)
	}
	if err := os.Rename(tmp, final); err != nil {
		return Template{}, fmt.Errorf("template %s: %w", r.Name, err)
	}
	if err := syncDir(b.dir); err != nil {
		return Template{}, fmt.Errorf("template %s: %w", r.Name, err)
	}
	t.Path = filepath.Join(final, rootfsDir)
	progress(fmt.Sprintf("template %s: built %s in %.1fs, %d MiB", r.Name, digest[:12], t.BuildSeconds, size>>20))
	return t, nil
}

// mmdebstrapArgs are the arguments that build r into rootfs.
func mmdebstrapArgs(r Recipe, rootfs string) []string {
	args := []string{
		"--mode=root",
		"--format=directory",
		"--variant=" + r.Variant,
		`--aptopt=Acquire::Languages "none"`,
		`--aptopt=APT::Install-Recommends "false"`,
		`--aptopt=APT::Install-Suggests "false"`,
		// dpkg's per-file fsync roughly doubles install time; the build is
		// made durable with one syncfs before the template is marked done.
		"--dpkgopt=force-unsafe-io",
		"--dpkgopt=path-exclude=/usr/share/doc/*",
		"--dpkgopt=path-exclude=/usr/share/man/*",
		"--dpkgopt=path-exclude=/usr/share/info/*",
		"--dpkgopt=path-exclude=/usr/share/locale/*",
		"--dpkgopt=path-include=/usr/share/locale/locale.alias",
	}
	if len(r.Packages) > 0 {
		args = append(args, "--include="+strings.Join(r.Packages, ","))
	}
	hooks := slices.Concat(hostsHook, r.Customize, finalHooks)
	for _, c := range hooks {
		// mmdebstrap runs hooks with sh, the rootfs as $1. Inside the
		// chroot a symlink in the image cannot point a write at the host.
		args = append(args, `--customize-hook=chroot "$1" /bin/sh -c `+shellQuote(c))
	}
	return append(args, r.Suite, rootfs, r.Mirror)
}

// hostsHook runs before a recipe's own commands (which may add names):
// Debian leaves /etc/hosts to the installer, so without it `localhost`
// does not resolve in a sandbox (getaddrinfo fails; servers told to bind
// localhost do not start).
var hostsHook = []string{
	`printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' > /etc/hosts && chmod 0644 /etc/hosts`,
}

// finalHooks run after a recipe's commands, which may still need what
// they undo. mmdebstrap copies the build host's /etc/resolv.conf (naming
// the host's resolver) and /etc/hostname with the host's modes; a sandbox
// has no resolver (names are resolved on the host by the egress proxy),
// so it gets a file with no nameserver, present so that tools reading it
// find it. The dpkg options (force-unsafe-io, the doc excludes) are for
// the build: mmdebstrap leaves them in the image, where they would apply
// to every package a sandbox installs.
var finalHooks = []string{
	`rm -f /etc/resolv.conf && printf '# no resolver: names are resolved on the host by the egress proxy\n' > /etc/resolv.conf && chmod 0644 /etc/resolv.conf`,
	`[ ! -e /etc/hostname ] || chmod 0644 /etc/hostname`,
	`rm -f /etc/dpkg/dpkg.cfg.d/99mmdebstrap`,
}

// runMmdebstrap runs mmdebstrap, streaming its output to progress.
//
// It runs in its own mount namespace (private propagation), so the /proc,
// /sys and /dev mounts it makes inside the rootfs vanish with it even when
// it is killed: a cancelled build can then be removed without reaching
// through a bind mount into the host's /dev. It runs in its own process
// group so cancellation kills apt and dpkg too.
func runMmdebstrap(ctx context.Context, r Recipe, rootfs string, progress func(string)) error {
	cmd := exec.CommandContext(ctx, "mmdebstrap", mmdebstrapArgs(r, rootfs)...)
	cmd.Env = buildEnv(os.Environ())
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid:      true,
		Unshareflags: syscall.CLONE_NEWNS,
		// A server killed outright (SIGKILL, OOM) takes its build along
		// instead of leaving mmdebstrap running unowned; the helpers it
		// started (dpkg-deb, tar, apt) end when their pipes to it break.
		Pdeathsig: syscall.SIGKILL,
	}
	// Linux sends Pdeathsig when the thread that forked the child exits,
	// not the process (golang/go#27505), and the runtime ends threads (one
	// whose goroutine exits locked). This goroutine keeps its thread from
	// Start until Wait returned, so only the server's death fires it.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	pr, pw := io.Pipe()
	cmd.Stdout = pw
	cmd.Stderr = pw

	var tail []string // last lines, for the error message
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			progress(line)
			tail = append(tail, line)
			if len(tail) > 20 {
				tail = tail[1:]
			}
		}
		io.Copy(io.Discard, pr) // an over-long line: keep draining
	}()
	err := cmd.Start()
	if err == nil {
		err = cmd.Wait()
	}
	pw.Close()
	<-done
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return fmt.Errorf("template %s: build cancelled: %w", r.Name, ctx.Err())
	}
	out := strings.Join(tail, "\n")
	cls := errdefs.ErrInternal
	switch {
	case strings.Contains(out, "Unable to locate package"),
		strings.Contains(out, "has no installation candidate"),
		strings.Contains(out, "unable to resolve") && strings.Contains(out, "package"),
		strings.Contains(out, "Unmet dependencies"),
		strings.Contains(out, "customize-hook") && strings.Contains(out, "failed"):
		cls = errdefs.ErrInvalidArgument
	case strings.Contains(out, "Could not resolve"),
		strings.Contains(out, "Failed to fetch"),
		strings.Contains(out, "Temporary failure"):
		cls = errdefs.ErrUnavailable
	}
	return fmt.Errorf("template %s: mmdebstrap failed (%v): %w\n%s", r.Name, err, cls, out)
}

// buildEnv is the environment of a build: what it needs from the server's
// (locale, TMPDIR, the proxy apt must use) and nothing else, since the
// customize commands run with it inside the image and the server's
// environment may hold credentials. The system PATH only: mmdebstrap's
// helpers (mmtarfilter) are Python scripts run with `env python3`, and a
// user's python shim (pyenv and the like) in PATH makes every package
// extraction pay its start-up.
func buildEnv(environ []string) []string {
	var env []string
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "LANG", "LANGUAGE", "TMPDIR",
			"http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY":
			env = append(env, kv)
		default:
			if strings.HasPrefix(k, "LC_") && k != "LC_ALL" {
				env = append(env, kv)
			}
		}
	}
	return append(env, "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C.UTF-8", "DEBIAN_FRONTEND=noninteractive")
}

// shellQuote quotes s for sh as one word.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
