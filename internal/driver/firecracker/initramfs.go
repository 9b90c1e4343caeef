package firecracker

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spacesandbox/space/internal/digest"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/filelock"
	"github.com/spacesandbox/space/internal/vmimage"
)

// The agent reaches the host over virtio-vsock here, not virtio-serial.
// Debian's cloud kernel builds the vsock transport as modules, which the
// initramfs of internal/vmimage (made for QEMU) does not carry. Rather than
// a second initramfs builder, this driver appends a small second newc
// archive holding those modules to vmimage's archive: the kernel unpacks
// concatenated archives in order, into the same root.
//
// The appended modules are named z<NN>-<name>.ko: the agent loads
// /lib/modules/*.ko in name order, vmimage's are named <NN>-<name>.ko, so
// these load after them (and after the virtio core they depend on).

// vsockModules are the guest modules Firecracker's vsock device needs.
var vsockModules = []string{"vmw_vsock_virtio_transport"}

// initramfsFormat changes when the appended archive's layout changes.
const initramfsFormat = "space-fc-initramfs-1"

// initramfs returns the cached initramfs for agentPath: vmimage's archive
// with the vsock modules appended. It is cached under
// <CacheDir>/firecracker by the digest of its inputs.
func (d *Driver) initramfs(ctx context.Context, agentPath string) (string, error) {
	base, err := vmimage.Initramfs(ctx, d.cfg.CacheDir, d.modulesDir, agentPath)
	if err != nil {
		return "", err
	}
	extra, err := extraModules(d.modulesDir, vsockModules, vmimage.GuestModules)
	if err != nil {
		return "", err
	}
	if len(extra) == 0 {
		return base, nil // built into this kernel
	}
	h := sha256.New()
	// vmimage names its archive by the digest of its own inputs.
	fmt.Fprintf(h, "%s\nbase %s\n", initramfsFormat, filepath.Base(base))
	for _, m := range extra {
		sum, err := digest.File(m)
		if err != nil {
			return "", fmt.Errorf("firecracker: module: %w", err)
		}
		fmt.Fprintf(h, "%s %s\n", filepath.Base(m), sum)
	}
	dir := filepath.Join(d.cfg.CacheDir, "firecracker")
	final := filepath.Join(dir, "initramfs-"+hex.EncodeToString(h.Sum(nil))[:32]+".cpio")
	if _, err := os.Stat(final); err == nil {
		return final, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("firecracker: cache: %w", err)
	}
	unlock, err := filelock.Lock(ctx, final+".lock")
	if err != nil {
		return "", err
	}
	defer unlock()
	if _, err := os.Stat(final); err == nil {
		return final, nil // built by another process while we waited
	}
	tmp := fmt.Sprintf("%s.tmp-%d", final, os.Getpid())
	if err := appendModules(tmp, base, extra); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("firecracker: initramfs: %w", err)
	}
	if err := os.Rename(tmp, final); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("firecracker: initramfs: %w", err)
	}
	return final, nil
}

// appendModules writes base followed by a newc archive of mods under
// lib/modules/z<NN>-<name>.ko to dst (world-readable: the jailed
// firecracker reads it through a hard link).
func appendModules(dst, base string, mods []string) error {
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	in, err := os.Open(base)
	if err != nil {
		return err
	}
	n, err := io.Copy(out, in)
	in.Close()
	if err != nil {
		return err
	}
	// Archives start 4-byte aligned; the unpacker skips zero padding.
	if pad := (4 - n%4) % 4; pad > 0 {
		if _, err := out.Write(make([]byte, pad)); err != nil {
			return err
		}
	}
	w := &newcWriter{w: bufio.NewWriter(out), ino: 1 << 20}
	for k, m := range mods {
		b, err := os.ReadFile(m)
		if err != nil {
			return err
		}
		w.file(fmt.Sprintf("lib/modules/z%02d-%s", k, filepath.Base(m)), 0o644, b)
	}
	if err := w.close(); err != nil {
		return err
	}
	return out.Sync()
}

// extraModules returns the .ko paths of want and their dependencies,
// dependencies first, leaving out modules the base set already brings and
// modules built into the kernel (modules.builtin).
func extraModules(modulesDir string, want, base []string) ([]string, error) {
	deps, byName, err := readModulesDep(modulesDir)
	if err != nil {
		return nil, err
	}
	builtin, _ := os.ReadFile(filepath.Join(modulesDir, "modules.builtin"))
	isBuiltin := func(name string) bool {
		return strings.Contains(string(builtin), "/"+name+".ko\n")
	}
	seen := map[string]bool{}
	var out []string
	var visit func(mod string, emit bool)
	visit = func(mod string, emit bool) {
		if seen[mod] {
			return
		}
		seen[mod] = true
		for _, d := range deps[mod] {
			visit(d, emit)
		}
		if emit {
			out = append(out, filepath.Join(modulesDir, mod))
		}
	}
	for _, name := range base { // marks the base closure as present
		if mod, ok := byName[name]; ok {
			visit(mod, false)
		}
	}
	for _, name := range want {
		mod, ok := byName[name]
		if !ok {
			if isBuiltin(name) {
				continue
			}
			return nil, errdefs.Unavailable("firecracker: kernel module %s not found in %s", name, modulesDir)
		}
		visit(mod, true)
	}
	for _, m := range out {
		if !strings.HasSuffix(m, ".ko") {
			// The agent loads modules with a plain finit_module.
			return nil, errdefs.Unavailable("firecracker: compressed kernel module %s is not supported", m)
		}
	}
	return out, nil
}

// readModulesDep parses modulesDir/modules.dep: each module's path (relative
// to modulesDir) → its dependencies' paths, and module name → path.
func readModulesDep(modulesDir string) (map[string][]string, map[string]string, error) {
	f, err := os.Open(filepath.Join(modulesDir, "modules.dep"))
	if err != nil {
		return nil, nil, errdefs.Unavailable("firecracker: %v", err)
	}
	defer f.Close()
	deps := map[string][]string{}
	byName := map[string]string{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		mod, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		name, _, _ := strings.Cut(filepath.Base(mod), ".ko")
		byName[strings.ReplaceAll(name, "-", "_")] = mod
		deps[mod] = strings.Fields(rest)
	}
	return deps, byName, sc.Err()
}

// newcWriter writes the newc ("070701") cpio format the kernel unpacks.
// Only regular files: the directories come from the base archive.
type newcWriter struct {
	w   *bufio.Writer
	ino int
	err error
}

func (c *newcWriter) header(name string, mode uint32, size int) {
	if c.err != nil {
		return
	}
	_, c.err = fmt.Fprintf(c.w, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, 1, 0, size, 0, 0, 0, 0, len(name)+1, 0)
	c.ino++
	c.w.WriteString(name)
	c.w.WriteByte(0)
	c.pad(110 + len(name) + 1)
}

func (c *newcWriter) pad(n int) {
	for ; n%4 != 0; n++ {
		c.w.WriteByte(0)
	}
}

func (c *newcWriter) file(name string, perm uint32, data []byte) {
	c.header(name, 0o100000|perm, len(data))
	if c.err == nil {
		c.w.Write(data)
		c.pad(len(data))
	}
}

func (c *newcWriter) close() error {
	c.header("TRAILER!!!", 0, 0)
	if c.err != nil {
		return c.err
	}
	return c.w.Flush()
}
