package vmimage

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/spacesandbox/space/internal/digest"
	"github.com/spacesandbox/space/internal/errdefs"
)

// GuestModules are the kernel modules the guest needs before it can mount
// its root disk and reach the host: the cloud kernel builds every virtio
// driver as a module. Their dependencies are added from modules.dep.
var GuestModules = []string{"virtio_mmio", "virtio_blk", "virtio_console"}

// initramfsFormat changes when the initramfs layout changes, so a new
// layout never reuses an old cache entry.
const initramfsFormat = "space-initramfs-1"

// checkInitramfs tells a usable cached initramfs: a newc archive that
// ends with its trailer (a torn or truncated file does not).
func checkInitramfs(path string) error {
	if err := checkFile(path, 512, 0, []byte("070701")); err != nil {
		return err
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	tail := make([]byte, min(st.Size(), 512))
	if _, err := f.ReadAt(tail, st.Size()-int64(len(tail))); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if !bytes.Contains(tail, []byte("TRAILER!!!")) {
		return fmt.Errorf("%s: no cpio trailer", path)
	}
	return nil
}

// Initramfs returns an uncompressed newc cpio archive holding the agent at
// /init (the guest's PID 1, started as `/init --init ...` by the kernel
// command line) and GuestModules with their dependencies under
// /lib/modules, named NN-name.ko so that loading them in name order
// satisfies dependencies. It is cached by the digest of the agent binary
// and the modules.
//
// A process remembers what it built for an agent binary (by path, size and
// modification time) and returns that while the file is there: every VM
// create re-read modules.dep and re-hashed the modules and the ~10 MB
// agent, and failed for good once a kernel upgrade's autoremove deleted
// the modules directory chosen at start.
func Initramfs(ctx context.Context, cacheDir, modulesDir, agentPath string) (string, error) {
	key := initramfsKey{cacheDir: cacheDir, modulesDir: modulesDir, agent: agentPath}
	if fi, err := os.Stat(agentPath); err == nil {
		key.size, key.mtime = fi.Size(), fi.ModTime().UnixNano()
		if v, ok := initramfsMemo.Load(key); ok {
			if checkInitramfs(v.(string)) == nil {
				return v.(string), nil
			}
			initramfsMemo.Delete(key)
		}
	}
	path, err := buildInitramfs(ctx, cacheDir, modulesDir, agentPath)
	if err == nil && key.size > 0 {
		initramfsMemo.Store(key, path)
	}
	return path, err
}

// initramfsKey names one Initramfs build in this process.
type initramfsKey struct {
	cacheDir, modulesDir, agent string
	size, mtime                 int64
}

var initramfsMemo sync.Map // initramfsKey → path

func buildInitramfs(ctx context.Context, cacheDir, modulesDir, agentPath string) (string, error) {
	mods, err := moduleClosure(modulesDir, GuestModules)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	io.WriteString(h, initramfsFormat+"\n")
	ad, err := digest.File(agentPath)
	if err != nil {
		return "", errdefs.Unavailable("vmimage: agent binary: %v", err)
	}
	io.WriteString(h, "agent "+ad+"\n")
	for _, m := range mods {
		d, err := digest.File(m)
		if err != nil {
			return "", fmt.Errorf("vmimage: module: %w", err)
		}
		io.WriteString(h, filepath.Base(m)+" "+d+"\n")
	}
	digest := hex.EncodeToString(h.Sum(nil))
	return cached(ctx, filepath.Join(cacheDir, "initramfs"), digest[:32]+".cpio", checkInitramfs, func(tmp string) error {
		f, err := os.Create(tmp)
		if err != nil {
			return err
		}
		defer f.Close()
		w := newCpioWriter(f)
		for _, d := range []string{"dev", "proc", "sys", "tmp", "newroot", "lib", "lib/modules"} {
			w.dir(d, 0o755)
		}
		w.charDev("dev/console", 0o600, 5, 1)
		if err := w.fileFrom("init", 0o755, agentPath); err != nil {
			return err
		}
		for k, m := range mods {
			name := fmt.Sprintf("lib/modules/%02d-%s", k, filepath.Base(m))
			if err := w.fileFrom(name, 0o644, m); err != nil {
				return err
			}
		}
		if err := w.close(); err != nil {
			return err
		}
		return f.Sync()
	})
}

// moduleClosure returns the .ko paths of want and their dependencies,
// dependencies first, from modulesDir/modules.dep. Built-in modules
// (modules.builtin) need nothing.
func moduleClosure(modulesDir string, want []string) ([]string, error) {
	f, err := os.Open(filepath.Join(modulesDir, "modules.dep"))
	if err != nil {
		return nil, errdefs.Unavailable("vmimage: %v", err)
	}
	defer f.Close()
	deps := map[string][]string{} // module name → its .ko path, then dependency paths
	byName := map[string]string{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		mod, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		byName[modName(mod)] = mod
		deps[mod] = strings.Fields(rest)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	builtin, _ := os.ReadFile(filepath.Join(modulesDir, "modules.builtin"))
	var out []string
	seen := map[string]bool{}
	var visit func(mod string)
	visit = func(mod string) {
		if seen[mod] {
			return
		}
		seen[mod] = true
		for _, d := range deps[mod] {
			visit(d)
		}
		out = append(out, filepath.Join(modulesDir, mod))
	}
	for _, name := range want {
		mod, ok := byName[name]
		if !ok {
			if strings.Contains(string(builtin), "/"+name+".ko\n") {
				continue
			}
			return nil, errdefs.Unavailable("vmimage: kernel module %s not found in %s", name, modulesDir)
		}
		visit(mod)
	}
	return out, nil
}

// modName turns kernel/drivers/virtio/virtio_mmio.ko(.xz) into virtio_mmio.
func modName(path string) string {
	b := filepath.Base(path)
	b, _, _ = strings.Cut(b, ".ko")
	return strings.ReplaceAll(b, "-", "_")
}

// cpioWriter writes the newc ("070701") cpio format the kernel unpacks.
type cpioWriter struct {
	w   *bufio.Writer
	ino int
	err error
}

func newCpioWriter(w io.Writer) *cpioWriter {
	return &cpioWriter{w: bufio.NewWriterSize(w, 1<<20), ino: 1}
}

func (c *cpioWriter) header(name string, mode uint32, size int64, rmaj, rmin int) {
	if c.err != nil {
		return
	}
	nlink := 1
	if mode&0o170000 == 0o040000 {
		nlink = 2
	}
	_, c.err = fmt.Fprintf(c.w, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, nlink, 0, size, 0, 0, rmaj, rmin, len(name)+1, 0)
	c.ino++
	c.w.WriteString(name)
	c.w.WriteByte(0)
	c.pad(110 + len(name) + 1)
}

func (c *cpioWriter) pad(n int) {
	for n%4 != 0 {
		c.w.WriteByte(0)
		n++
	}
}

func (c *cpioWriter) dir(name string, perm uint32) { c.header(name, 0o040000|perm, 0, 0, 0) }

func (c *cpioWriter) charDev(name string, perm uint32, major, minor int) {
	c.header(name, 0o020000|perm, 0, major, minor)
}

func (c *cpioWriter) file(name string, perm uint32, data []byte) {
	c.header(name, 0o100000|perm, int64(len(data)), 0, 0)
	if c.err == nil {
		c.w.Write(data)
		c.pad(len(data))
	}
}

func (c *cpioWriter) fileFrom(name string, perm uint32, path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	c.file(name, perm, b)
	return c.err
}

func (c *cpioWriter) close() error {
	c.header("TRAILER!!!", 0, 0, 0, 0)
	if c.err != nil {
		return c.err
	}
	return c.w.Flush()
}
