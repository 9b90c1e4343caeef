package template

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
)

// tinyRecipe is the fastest useful build: the "essential" variant (no apt,
// no extra packages) still has /bin/sh and coreutils. About a minute.
func tinyRecipe() Recipe {
	return Recipe{
		Name:      "tiny",
		Variant:   "essential",
		Customize: []string{"echo built-by-space > /etc/space-test", "chmod 1777 /tmp"},
	}
}

// requireTools fails (not skips) the test when the build tools are absent:
// the Makefile installs them, so their absence is a broken machine.
func requireTools(t *testing.T) {
	t.Helper()
	if err := EnsureTools(t.Context()); err != nil {
		t.Fatalf("template builds need mmdebstrap as root (make deps installs it): %v", err)
	}
}

func newTestBuilder(t *testing.T) *Builder {
	t.Helper()
	b, err := NewBuilder(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// cacheEntries lists the cache dir, ignoring lock files.
func cacheEntries(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".lock") {
			out = append(out, e.Name())
		}
	}
	return out
}

func TestEnsureToolsMissing(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	err := EnsureTools(t.Context())
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "mmdebstrap") {
		t.Fatalf("EnsureTools without mmdebstrap = %v, want unavailable naming mmdebstrap", err)
	}
}

// A real build: two concurrent Builds of one recipe build once, the rootfs
// works, and the next Build is a cache hit.
func TestBuildReal(t *testing.T) {
	t.Parallel()
	requireTools(t)
	ctx := t.Context()
	b := newTestBuilder(t)
	r := tinyRecipe()

	start := time.Now()
	var wg sync.WaitGroup
	results := make([]Template, 2)
	errs := make([]error, 2)
	var mu sync.Mutex
	var lines []string
	for i := range 2 {
		wg.Go(func() {
			results[i], errs[i] = b.Build(ctx, r, func(line string) {
				mu.Lock()
				lines = append(lines, line)
				mu.Unlock()
			})
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Build %d: %v\noutput:\n%s", i, err, strings.Join(lines, "\n"))
		}
	}
	t.Logf("real mmdebstrap build (variant essential) took %s, %d MiB, %d output lines",
		elapsed.Round(time.Millisecond), results[0].SizeBytes>>20, len(lines))
	if n := b.builds.Load(); n != 1 {
		t.Fatalf("mmdebstrap ran %d times for two concurrent Builds, want 1", n)
	}
	tpl := results[0]
	if results[1].Digest != tpl.Digest || !results[1].BuiltAt.Equal(tpl.BuiltAt) || results[1].Path != tpl.Path {
		t.Fatalf("concurrent Builds disagree: %+v vs %+v", results[0], results[1])
	}
	if tpl.Digest != r.Digest() || tpl.Name != "tiny" || tpl.Kind != KindDir || tpl.SizeBytes < 10<<20 || tpl.BuiltAt.IsZero() {
		t.Fatalf("template = %+v", tpl)
	}
	if tpl.Path != filepath.Join(b.Dir(), tpl.Digest, "rootfs") {
		t.Fatalf("path %s", tpl.Path)
	}
	if _, err := os.Stat(filepath.Join(tpl.Path, "bin", "sh")); err != nil {
		t.Fatalf("rootfs has no /bin/sh: %v", err)
	}
	if data, err := os.ReadFile(filepath.Join(tpl.Path, "etc", "space-test")); err != nil || string(data) != "built-by-space\n" {
		t.Fatalf("customize hook did not run: %q %v", data, err)
	}
	if st, err := os.Stat(filepath.Join(tpl.Path, "tmp")); err != nil || st.Mode()&os.ModeSticky == 0 || st.Mode().Perm() != 0o777 {
		t.Fatalf("/tmp mode: %v %v", st.Mode(), err)
	}
	checkBuilderFiles(t, tpl.Path)
	if m, err := mountsUnder(b.Dir()); err != nil || len(m) != 0 {
		t.Fatalf("mounts left under the cache: %v %v", m, err)
	}
	if got := cacheEntries(t, b.Dir()); len(got) != 1 || got[0] != tpl.Digest {
		t.Fatalf("cache holds %v, want just %s", got, tpl.Digest)
	}

	// Cache hit: instant, no rebuild.
	start = time.Now()
	again, err := b.Build(ctx, r, nil)
	if err != nil {
		t.Fatal(err)
	}
	if hit := time.Since(start); hit > time.Second {
		t.Errorf("cache hit took %s", hit)
	}
	if b.builds.Load() != 1 || !again.BuiltAt.Equal(tpl.BuiltAt) {
		t.Fatalf("second Build rebuilt (builds=%d)", b.builds.Load())
	}

	// Another builder on the same cache (another process) sees it.
	b2, err := NewBuilder(b.Dir())
	if err != nil {
		t.Fatal(err)
	}
	got, err := b2.Lookup(tpl.Digest)
	if err != nil || got.Path != tpl.Path || got.SizeBytes != tpl.SizeBytes || got.Recipe.Variant != "essential" {
		t.Fatalf("Lookup = %+v, %v", got, err)
	}
	list, err := b2.List()
	if err != nil || len(list) != 1 || list[0].Digest != tpl.Digest {
		t.Fatalf("List = %+v, %v", list, err)
	}
	if _, err := b2.Build(ctx, r, nil); err != nil || b2.builds.Load() != 0 {
		t.Fatalf("second builder rebuilt: %v", err)
	}
}

// A recipe apt cannot satisfy fails as invalid argument and leaves nothing.
func TestBuildFailureLeavesNothing(t *testing.T) {
	t.Parallel()
	requireTools(t)
	b := newTestBuilder(t)
	r := Recipe{Name: "broken", Variant: "essential", Packages: []string{"space-no-such-package"}}
	start := time.Now()
	_, err := b.Build(t.Context(), r, nil)
	t.Logf("failed build took %s", time.Since(start).Round(time.Millisecond))
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("Build with unknown package = %v, want invalid argument", err)
	}
	if got := cacheEntries(t, b.Dir()); len(got) != 0 {
		t.Fatalf("failed build left %v in the cache", got)
	}
	if _, err := b.Lookup(r.Digest()); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Lookup after failure = %v", err)
	}
	if m, _ := mountsUnder(b.Dir()); len(m) != 0 {
		t.Fatalf("mounts left: %v", m)
	}
}

// Cancelling the context kills mmdebstrap and leaves nothing.
func TestBuildCancel(t *testing.T) {
	t.Parallel()
	requireTools(t)
	b := newTestBuilder(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var once sync.Once
	start := time.Now()
	_, err := b.Build(ctx, tinyRecipe(), func(line string) {
		if strings.HasPrefix(line, "I: ") { // mmdebstrap is running
			once.Do(cancel)
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Build = %v, want context.Canceled", err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("cancellation took %s", d)
	}
	if got := cacheEntries(t, b.Dir()); len(got) != 0 {
		t.Fatalf("cancelled build left %v in the cache", got)
	}
	if m, _ := mountsUnder(b.Dir()); len(m) != 0 {
		t.Fatalf("mounts left: %v", m)
	}
}

// Leftovers of a crashed builder (an unfinished final dir, temp dirs) are
// cleared by the next build and never returned by Lookup or List.
func TestStaleDebrisIgnored(t *testing.T) {
	b := newTestBuilder(t)
	d := tinyRecipe().Digest()
	if err := os.MkdirAll(filepath.Join(b.Dir(), d, "rootfs", "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Lookup(d); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Lookup of a dir without %s = %v", metadataFile, err)
	}
	if l, err := b.List(); err != nil || len(l) != 0 {
		t.Fatalf("List = %v, %v", l, err)
	}
	if _, err := b.Lookup("../etc"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("Lookup(../etc) = %v", err)
	}
}

func TestLockExcludes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	unlock, err := lockFile(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if _, err := lockFile(ctx, path); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second lock = %v, want to wait until the deadline", err)
	}
	unlock()
	unlock2, err := lockFile(t.Context(), path)
	if err != nil {
		t.Fatalf("lock after unlock: %v", err)
	}
	unlock2()
}

// checkBuilderFiles checks what the builder gives every template, whatever
// its recipe: localhost resolves, nothing of the build host's network
// setup or of the build's dpkg options is left.
func checkBuilderFiles(t *testing.T, rootfs string) {
	t.Helper()
	if data, err := os.ReadFile(filepath.Join(rootfs, "etc", "hosts")); err != nil ||
		!strings.HasPrefix(string(data), "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n") {
		t.Errorf("/etc/hosts = %q, %v", data, err)
	}
	for _, name := range []string{"hosts", "hostname", "resolv.conf"} {
		if st, err := os.Lstat(filepath.Join(rootfs, "etc", name)); err != nil {
			t.Errorf("/etc/%s: %v", name, err)
		} else if st.Mode() != 0o644 {
			t.Errorf("/etc/%s: mode %v, want a 0644 file", name, st.Mode())
		}
	}
	if data, err := os.ReadFile(filepath.Join(rootfs, "etc", "resolv.conf")); err != nil || strings.Contains(string(data), "nameserver") {
		t.Errorf("/etc/resolv.conf = %q, %v; want no nameserver", data, err)
	}
	if _, err := os.Lstat(filepath.Join(rootfs, "etc", "dpkg", "dpkg.cfg.d", "99mmdebstrap")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the build's dpkg options are left in the image: %v", err)
	}
	// As a sandbox sees it: no network namespace of the host's.
	out, err := exec.Command("unshare", "--net", "chroot", rootfs, "getent", "hosts", "localhost").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "localhost") {
		t.Errorf("getent hosts localhost in the rootfs: %v: %s", err, out)
	}
}

// fakeMmdebstrap puts a shell script named mmdebstrap first in PATH. A
// build finds mmdebstrap in the server's PATH, then runs it with its own.
func fakeMmdebstrap(t *testing.T, script string) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "mmdebstrap"), []byte("#!/bin/sh\n"+script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
}

// A build gets the variables it needs from the server's environment, and
// none of the others (the server's may hold credentials, and customize
// commands run with it inside the image).
func TestBuildEnv(t *testing.T) {
	fakeMmdebstrap(t, "env\nexit 3\n")
	t.Setenv("SPACE_TEST_SENTINEL", "sentinel-6d1f")
	t.Setenv("https_proxy", "http://proxy.example:3128")
	t.Setenv("NO_PROXY", "deb.example")
	t.Setenv("LANG", "C.UTF-8")
	t.Setenv("TMPDIR", "/var/tmp")
	t.Setenv("LC_ALL", "de_DE.UTF-8")
	var lines []string
	err := runMmdebstrap(t.Context(), Recipe{Name: "env"}, filepath.Join(t.TempDir(), "rootfs"), func(l string) { lines = append(lines, l) })
	if err == nil {
		t.Fatal("the fake mmdebstrap failed, the build did not")
	}
	if slices.ContainsFunc(lines, func(l string) bool { return strings.Contains(l, "sentinel-6d1f") }) {
		t.Errorf("the build inherited the server's whole environment:\n%s", strings.Join(lines, "\n"))
	}
	for _, want := range []string{
		"https_proxy=http://proxy.example:3128", "NO_PROXY=deb.example", "LANG=C.UTF-8", "TMPDIR=/var/tmp",
		"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C.UTF-8", "DEBIAN_FRONTEND=noninteractive",
	} {
		if !slices.Contains(lines, want) {
			t.Errorf("build environment lacks %s:\n%s", want, strings.Join(lines, "\n"))
		}
	}
}

// A server killed outright (SIGKILL: no cancellation runs) takes its
// build along. The test runs itself as the "server" and kills it.
func TestBuildDiesWithServer(t *testing.T) {
	if dir := os.Getenv("SPACE_TEST_BUILD_SERVER"); dir != "" {
		_ = runMmdebstrap(context.Background(), Recipe{Name: "orphan"}, filepath.Join(dir, "rootfs"), func(string) {})
		return
	}
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pid")
	fakeMmdebstrap(t, "echo $$ > "+pidFile+".tmp && mv "+pidFile+".tmp "+pidFile+"\nexec sleep 600\n")
	server := exec.Command(os.Args[0], "-test.run=^TestBuildDiesWithServer$", "-test.count=1")
	server.Env = append(os.Environ(), "SPACE_TEST_BUILD_SERVER="+dir)
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	defer server.Wait()
	defer server.Process.Kill()
	pid := 0
	for deadline := time.Now().Add(30 * time.Second); pid == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the build did not start")
		}
		if b, err := os.ReadFile(pidFile); err == nil {
			pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	server.Process.Kill()
	server.Wait()
	for deadline := time.Now().Add(5 * time.Second); alive(pid); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("mmdebstrap (pid %d) outlived the server that started it", pid)
		}
	}
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(rest, "Z")
}
